"""Numbered Postgres migrations, shipped as package data of ``agentpost.sql``."""
