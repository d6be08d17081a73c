"""Airflow operators and sensors for agentpost, installed as ``agentpost.operators``."""
