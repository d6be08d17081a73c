"""docker/compose.yaml describes a complete deployment (no Docker engine here: the file is
parsed and checked for consistency, and `docker-compose config` validates it; the tool is
installed by docker/ensure-compose-tool.sh, which `make test` runs)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from dist_support import tracked_files

DOCKER = Path(__file__).resolve().parents[2] / "docker"
AIRFLOW_SERVICES = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the "KEY=value" form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends_on(service: dict) -> set[str]:
    return set(service.get("depends_on") or ())


def _airflow_services(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items() if name.startswith("airflow-")}


def test_postgres_service(compose: dict) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"].split(":") == ["postgres", "15"]
    assert _environment(postgres)["POSTGRES_DB"] == "agentpost"
    assert "healthcheck" in postgres


def test_airflow_components_exist(compose: dict) -> None:
    services = compose["services"]
    for name, command in AIRFLOW_SERVICES.items():
        assert name in services
        assert services[name]["command"] == command


def test_airflow_services_use_the_project_image(compose: dict) -> None:
    for name, service in _airflow_services(compose).items():
        build = service["build"]
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert (DOCKER / build["context"] / build["dockerfile"]).is_file(), name


def test_airflow_services_depend_on_postgres(compose: dict) -> None:
    for name, service in _airflow_services(compose).items():
        assert "postgres" in _depends_on(service), name
        if name in AIRFLOW_SERVICES:  # the long-running ones wait for the migrations
            assert "airflow-init" in _depends_on(service), name


def test_airflow_services_reach_the_store_and_metadata_db(compose: dict) -> None:
    services = _airflow_services(compose)
    assert set(AIRFLOW_SERVICES) <= set(services)
    for name, service in services.items():
        env = _environment(service)
        assert env.get("AGENTPOST_DSN", "").startswith("postgresql://"), name
        assert "@postgres:5432/agentpost" in env["AGENTPOST_DSN"], name
        assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name


def test_dockerfile_installs_the_project() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "FROM apache/airflow:" in dockerfile
    assert "--constraint constraints.txt" in dockerfile
    assert "pyspark==4.3.0" in dockerfile


@pytest.fixture(scope="module")
def docker_compose() -> str:
    """The docker-compose tool, installed by the same script `make test` runs when missing
    (as root on Debian); never skipped: a missing tool fails with what to install."""
    if shutil.which("docker-compose") is None:
        subprocess.run(["sh", str(DOCKER / "ensure-compose-tool.sh")], check=False,
                       timeout=600)
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose is missing: run docker/ensure-compose-tool.sh (or make test)"
    return tool


def test_docker_compose_accepts_the_file(docker_compose: str) -> None:
    proc = subprocess.run(
        [docker_compose, "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_everything_the_dockerfile_copies_is_in_the_repository() -> None:
    """A fresh clone must build: every COPY source is tracked (git drops empty folders)."""
    tracked = tracked_files(DOCKER.parent)
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        parts = line.split()
        if not parts or parts[0] != "COPY":
            continue
        sources = [p for p in parts[1:-1] if not p.startswith("--")]
        for source in sources:
            assert any(t == source or t.startswith(source.rstrip("/") + "/") for t in tracked), (
                f"Dockerfile copies {source}, which a fresh clone does not have")


# -- the multi-container deployment ---------------------------------------------------------

DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def resolved(value: str) -> str:
    """A compose value with its ${VAR:-default} substitutions at their defaults."""
    return DEFAULT.sub(lambda m: m.group(2), value)


def url(service: dict, key: str) -> tuple[str, str | None, str | None, int | None, str]:
    """scheme, user, host, port and database of a URL in a service's environment."""
    parts = urlsplit(resolved(_environment(service)[key]))
    return parts.scheme, parts.username, parts.hostname, parts.port, parts.path.lstrip("/")


def command_of(service: dict) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def test_store_and_metadata_live_in_separate_databases(compose: dict) -> None:
    services = compose["services"]
    postgres = services["postgres"]
    for name, service in _airflow_services(compose).items():
        _, store_user, store_host, _, store_db = url(service, "AGENTPOST_DSN")
        _, meta_user, meta_host, _, meta_db = url(service, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
        assert store_host == meta_host == "postgres", name
        assert store_db != meta_db and store_user != meta_user, name
        assert store_db == _environment(postgres)["POSTGRES_DB"], name
    # the metadata database and its role are created on the server's first start
    init_dir = next(v.split(":")[0] for v in postgres["volumes"]
                    if ":/docker-entrypoint-initdb.d" in v)
    scripts = sorted((DOCKER / init_dir).glob("*.sh"))
    assert scripts and all(os.access(s, os.X_OK) for s in scripts), init_dir
    init = "\n".join(s.read_text() for s in scripts)
    assert f"CREATE DATABASE {meta_db} OWNER {meta_user}" in init
    assert f"CREATE ROLE {meta_user} LOGIN PASSWORD" in init
    assert "AIRFLOW_DB_PASSWORD" in _environment(postgres)


def test_the_agentpost_connection_is_the_store(compose: dict) -> None:
    for name, service in _airflow_services(compose).items():
        conn = json.loads(resolved(_environment(service)["AIRFLOW_CONN_AGENTPOST_DEFAULT"]))
        _, user, host, port, database = url(service, "AGENTPOST_DSN")
        password = urlsplit(resolved(_environment(service)["AGENTPOST_DSN"])).password
        assert conn["conn_type"] == "agentpost", name
        assert (conn["host"], conn["port"], conn["login"], conn["password"], conn["schema"]) \
            == (host, port, user, password, database), name
        assert conn["extra"]["connect_timeout"] > 0, name


def test_celery_workers_and_their_broker(compose: dict) -> None:
    services = compose["services"]
    airflow = _airflow_services(compose)
    workers = [n for n, s in airflow.items() if command_of(s)[:2] == ["celery", "worker"]]
    assert workers, "a CeleryExecutor deployment without workers"
    for name, service in airflow.items():
        env = _environment(service)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        scheme, _, broker, _, _ = url(service, "AIRFLOW__CELERY__BROKER_URL")
        assert scheme == "redis" and broker in services, name
        assert "healthcheck" in services[broker]
        if name != "airflow-init":
            assert broker in _depends_on(service), name
        backend = urlsplit(resolved(env["AIRFLOW__CELERY__RESULT_BACKEND"]).removeprefix("db+"))
        meta = urlsplit(resolved(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
        assert (backend.hostname, backend.path) == (meta.hostname, meta.path), name
    for worker in workers:
        assert "airflow-init" in _depends_on(airflow[worker])


def test_spark_master_and_worker(compose: dict) -> None:
    services = compose["services"]
    master, worker = services["spark-master"], services["spark-worker"]
    master_args = command_of(master)
    assert master["entrypoint"] == ["spark-class"] == worker["entrypoint"]
    assert master_args[0] == "org.apache.spark.deploy.master.Master"
    host = master_args[master_args.index("--host") + 1]
    port = int(master_args[master_args.index("--port") + 1])
    assert host == "spark-master"
    worker_args = command_of(worker)
    assert worker_args[:2] == ["org.apache.spark.deploy.worker.Worker",
                               f"spark://{host}:{port}"]
    assert "spark-master" in _depends_on(worker)
    project = services["airflow-scheduler"]
    for service in (master, worker):  # one image: driver and cluster share a Spark version
        assert (service["build"], service["image"]) == (project["build"], project["image"])
    for name, service in _airflow_services(compose).items():
        spark = json.loads(_environment(service)["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert (spark["conn_type"], spark["host"], spark["port"]) == (
            "spark", f"spark://{host}", port), name


def _mounts(service: dict) -> dict[str, str]:
    """A service's mounts, container path -> source."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes") or ()}


def test_spark_jobs_share_checkpoints_and_the_trail_export(compose: dict) -> None:
    """The audit (a driver on any Airflow worker) reads the checkpoints the maintenance DAG
    wrote on another; the export's Parquet is written and read by the Spark executors: both
    directories are named volumes mounted where the environment says, on every Airflow
    container and (the export) on the Spark worker."""
    declared = set(compose.get("volumes") or ())
    for name, service in _airflow_services(compose).items():
        env, mounts = _environment(service), _mounts(service)
        for var in ("AGENTPOST_CHECKPOINT_DIR", "AGENTPOST_TRAIL_ARCHIVE"):
            assert mounts.get(env[var]) in declared, (name, var)
    archive = _environment(compose["services"]["airflow-worker"])["AGENTPOST_TRAIL_ARCHIVE"]
    worker = _mounts(compose["services"]["spark-worker"])
    assert worker[archive] == _mounts(compose["services"]["airflow-worker"])[archive]


def test_dependencies_and_ports_are_consistent(compose: dict) -> None:
    services = compose["services"]
    published = []
    for name, service in services.items():
        assert _depends_on(service) <= set(services), name
        published += [str(p).split(":")[0] for p in service.get("ports", ())]
    assert len(published) == len(set(published)), published
    secrets = {_environment(s)["AIRFLOW__API_AUTH__JWT_SECRET"]
               for s in _airflow_services(compose).values()}
    assert len(secrets) == 1, "components must share one JWT secret"
    init = command_of(services["airflow-init"])
    assert "airflow db migrate" in init[-1] and "agentpost migrate" in init[-1]


def test_dockerfile_installs_the_deployment_extras() -> None:
    extras = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(dep.startswith("asyncpg") for dep in extras["postgres"])
    assert any(dep.startswith("apache-airflow-providers-celery") for dep in extras["celery"])
    assert any(dep.startswith("apache-airflow-providers-apache-spark") for dep in extras["spark"])
    assert any(dep.startswith("apache-airflow-providers-common-ai") for dep in extras["ai"])
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert '".[postgres,celery,spark,ai]"' in dockerfile
    # the trail jobs refuse pyspark-client's files over another pyspark: the image is checked
    assert "agentpost spark check" in dockerfile
