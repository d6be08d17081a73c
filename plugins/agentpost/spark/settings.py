"""What a Spark job over the trail needs to know, from the environment or its arguments.

- AGENTPOST_DSN: the store's Postgres DSN (no default).
- AGENTPOST_TRAIL_KEY: the trail's HMAC key; the audit checks signatures with it.
- AGENTPOST_JDBC_JAR: the PostgreSQL JDBC driver jar; default /usr/share/java/postgresql.jar,
  from Debian's libpostgresql-jdbc-java.
- AGENTPOST_SPARK_PARTITIONS: JDBC partitions of a large read; 0 (default) means two per
  core Spark has.
- AGENTPOST_TRAIL_ARCHIVE: the directory of the trail's Parquet export; none (default) means
  everything is read from Postgres.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from psycopg2.extensions import parse_dsn
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentpost.config import DEVELOPMENT_TRAIL_KEY
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import ConfigurationError

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"

_ENV = {
    "dsn": "AGENTPOST_DSN",
    "read_dsn": "AGENTPOST_READ_DSN",
    "trail_key": "AGENTPOST_TRAIL_KEY",
    "jdbc_jar": "AGENTPOST_JDBC_JAR",
    "partitions": "AGENTPOST_SPARK_PARTITIONS",
    "archive": "AGENTPOST_TRAIL_ARCHIVE",
}


class JdbcTarget(BaseModel):
    """The store's database as the JDBC driver addresses it."""

    model_config = ConfigDict(frozen=True)

    url: str
    user: str | None = None
    password: str | None = None

    def options(self) -> dict[str, str]:
        """The Spark JDBC options that reach the database (the password never in the URL)."""
        opts = {"url": self.url, "driver": "org.postgresql.Driver"}
        if self.user:
            opts["user"] = self.user
        if self.password:
            opts["password"] = self.password
        return opts


class SparkSettings(BaseModel):
    """A job's configuration: arguments win over the environment, which wins over defaults."""

    model_config = ConfigDict(frozen=True)

    dsn: str
    #: a streaming standby the job reads from (its snapshot and every JDBC partition);
    #: what it writes (the audit's report, the analytics' tables) goes to `dsn`
    read_dsn: str | None = None
    trail_key: str = DEVELOPMENT_TRAIL_KEY
    jdbc_jar: str = DEFAULT_JDBC_JAR
    partitions: int = Field(default=0, ge=0, le=10_000)
    archive: str | None = None
    #: rows per JDBC round trip
    fetch_size: int = Field(default=20_000, gt=0)

    @classmethod
    def from_env(cls, **overrides: object) -> SparkSettings:
        values: dict[str, object] = {k: os.environ[v] for k, v in _ENV.items()
                                     if os.environ.get(v)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values.get("dsn"):
            raise ConfigurationError("no store configured: set AGENTPOST_DSN or give --dsn")
        try:
            return cls(**values)
        except ValueError as exc:
            raise ConfigurationError(f"bad Spark job configuration: {exc}") from None

    @model_validator(mode="after")
    def _readable(self) -> SparkSettings:
        if self.read_dsn is not None:
            self.jdbc(read=True)  # a standby's DSN must be one JDBC can use, as the store's
        return self

    @property
    def key(self) -> bytes:
        return self.trail_key.encode("utf-8")

    @property
    def libpq(self) -> str:
        return libpq_dsn(self.dsn)

    @property
    def read_libpq(self) -> str:
        """Where the job reads: the standby when one is given, else the store."""
        return libpq_dsn(self.read_dsn or self.dsn)

    def jdbc(self, *, read: bool = False) -> JdbcTarget:
        """The JDBC URL and credentials of `dsn` (a URL or key=value DSN), or of where the
        job reads (`read`: `read_dsn` when given)."""
        try:
            params = parse_dsn(self.read_libpq if read else self.libpq)
        except Exception as exc:  # psycopg2 raises ProgrammingError on a malformed DSN
            raise ConfigurationError(f"the store DSN is not a valid Postgres DSN: {exc}") from None
        host = params.get("host") or "localhost"
        if host.startswith("/"):
            raise ConfigurationError("the JDBC driver cannot use a Unix socket: give the store "
                                     "DSN a TCP host (e.g. host=127.0.0.1)")
        port = params.get("port") or "5432"
        dbname = params.get("dbname") or params.get("user") or "postgres"
        extra = [f"{k}={quote(params[k], safe='')}"
                 for k in ("sslmode", "application_name") if params.get(k)]
        url = f"jdbc:postgresql://{host}:{port}/{quote(dbname, safe='')}"
        if extra:
            url += "?" + "&".join(extra)
        return JdbcTarget(url=url, user=params.get("user"), password=params.get("password"))

    def require_jar(self) -> str:
        """The driver jar's path, or a ConfigurationError saying how to get it."""
        if not os.path.isfile(self.jdbc_jar):
            raise ConfigurationError(
                f"the PostgreSQL JDBC driver is not at {self.jdbc_jar}: install Debian's "
                "libpostgresql-jdbc-java (apt-get install libpostgresql-jdbc-java) or set "
                "AGENTPOST_JDBC_JAR to the driver jar")
        return self.jdbc_jar
