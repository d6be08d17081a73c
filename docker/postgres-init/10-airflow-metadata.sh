#!/bin/sh
# Run once by the postgres image on an empty data directory (/docker-entrypoint-initdb.d):
# Airflow's metadata gets a database and role of its own beside the agentpost store's
# (POSTGRES_DB / POSTGRES_USER), so the two can be backed up, sized and restored apart.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v airflow_password="$AIRFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
SQL
