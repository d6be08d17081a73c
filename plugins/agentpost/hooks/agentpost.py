"""The Airflow hook over an ``agentpost`` connection: where the envelope store lives.

Tasks cannot use Airflow's metadata ORM, and the store is a database of its own, so a task,
sensor or trigger reaches it through a Connection of type ``agentpost`` (host, port, login,
password, schema = database name), read through the Task SDK (``BaseHook.get_connection``,
which asks the worker's supervisor or the configured secrets backends). Two keys of the
connection's extra are understood:

- ``dsn``: a complete libpq DSN or URI, used as is (for options the fields cannot express);
- ``trail_key``: the HMAC key that signs the trail (else AGENTPOST_TRAIL_KEY).

Other libpq options (``sslmode``, ``connect_timeout``, ...) in the extra become query
parameters of the DSN. When the connection is not defined at all, the hook falls back to
AGENTPOST_DSN, so a deployment configured for the CLI works in Airflow unchanged.

The connection form's labels and placeholders are declared in the provider info
(``ui-field-behaviour``), not here: hook methods for them are deprecated since Airflow 3.2.

`get_store` and `test_connection` (the form's Test button) probe the store once before use:
unreachable, refused or not migrated, the error names the connection it came from, so a task
log says which connection to fix instead of showing a failure deep inside a protocol step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from agentpost.protocol.errors import AgentpostError, ConfigurationError

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from agentpost.pg.migrations import SchemaStatus
    from agentpost.store import EnvelopeStore

#: extra keys passed through to libpq as URI query parameters
LIBPQ_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
                 "application_name", "options", "target_session_attrs")


@dataclass(frozen=True)
class StoreTarget:
    """Where the store is and how to sign the trail: what a store needs to open."""

    dsn: str = field(repr=False)  # carries the password
    trail_key: str | None = field(default=None, repr=False)
    source: str = "connection"

    def open(self) -> EnvelopeStore:
        from agentpost.store import EnvelopeStore

        return EnvelopeStore(self.dsn, trail_key=self.trail_key)

    def check(self) -> SchemaStatus:
        """Reach the store once and check its schema (see `check_schema`)."""
        from agentpost.pg.migrations import check_schema

        return check_schema(self.dsn)


def _host(host: str) -> str:
    """A host as it must appear in a URI: socket directories percent-encoded, IPv6 in
    brackets."""
    if host.startswith("/"):
        return quote(host, safe="")
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return quote(host, safe=".-_~")


def dsn_from_connection(conn: Connection, extra: dict[str, Any]) -> str:
    """A ``postgresql://`` DSN from a connection's fields (or its extra's ``dsn``)."""
    if extra.get("dsn"):
        return str(extra["dsn"])
    if not conn.host:
        raise ConfigurationError(
            f"connection {conn.conn_id!r} has no host (and no 'dsn' in its extra)")
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="")
        if conn.password:
            auth += ":" + quote(conn.password, safe="")
        auth += "@"
    port = f":{int(conn.port)}" if conn.port else ""
    database = "/" + quote(conn.schema, safe="") if conn.schema else ""
    options = {k: str(extra[k]) for k in LIBPQ_OPTIONS if extra.get(k) not in (None, "")}
    query = "?" + urlencode(options) if options else ""
    return f"postgresql://{auth}{_host(conn.host)}{port}{database}{query}"


def target_from_environment(conn_id: str) -> StoreTarget:
    """The store AGENTPOST_DSN names, for when connection `conn_id` is not defined (the hook
    and the UI page fall back to it alike)."""
    dsn = os.environ.get("AGENTPOST_DSN")
    if not dsn:
        raise ConfigurationError(
            f"no agentpost store: connection {conn_id!r} is not defined and AGENTPOST_DSN is "
            "not set")
    return StoreTarget(dsn=dsn, trail_key=None, source="AGENTPOST_DSN")


def _blame(exc: AgentpostError, conn_id: str, source: str) -> AgentpostError:
    """The same error, its message prefixed with where the store's address came from."""
    if source == "AGENTPOST_DSN":
        where = f"agentpost store from AGENTPOST_DSN (connection {conn_id!r} is not defined)"
    else:
        where = f"agentpost connection {conn_id!r}"
    return type(exc)(f"{where}: {exc}")


class AgentpostHook(BaseHook):
    """Opens the agentpost envelope store named by an Airflow connection.

    :param agentpost_conn_id: the connection (type ``agentpost``); when it does not exist,
        AGENTPOST_DSN is used instead.
    """

    conn_name_attr = "agentpost_conn_id"
    default_conn_name = "agentpost_default"
    conn_type = "agentpost"
    hook_name = "agentpost"

    def __init__(self, agentpost_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.agentpost_conn_id = agentpost_conn_id
        self._target: StoreTarget | None = None
        self._checked = False

    # -- resolution -----------------------------------------------------------------------

    def get_target(self) -> StoreTarget:
        """The store's DSN and trail key (resolved once per hook)."""
        if self._target is None:
            try:
                conn = self.get_connection(self.agentpost_conn_id)
            except AirflowNotFoundException:
                self._target = target_from_environment(self.agentpost_conn_id)
            else:
                self._target = self._target_of(conn, conn.extra_dejson)
        return self._target

    async def aget_target(self) -> StoreTarget:
        """The same from async code (a trigger): the SDK's sync calls would block the
        triggerer's event loop or deadlock on its supervisor channel."""
        if self._target is None:
            try:
                conn = await self.aget_connection(self.agentpost_conn_id)
            except AirflowNotFoundException:
                self._target = target_from_environment(self.agentpost_conn_id)
            else:
                self._target = self._target_of(conn, await conn.aextra_dejson())
        return self._target

    @staticmethod
    def _target_of(conn: Connection, extra: dict[str, Any]) -> StoreTarget:
        key = extra.get("trail_key")
        return StoreTarget(dsn=dsn_from_connection(conn, extra),
                           trail_key=str(key) if key else None)

    def get_dsn(self) -> str:
        """The store's DSN: from the connection, else AGENTPOST_DSN."""
        return self.get_target().dsn

    async def aget_dsn(self) -> str:
        return (await self.aget_target()).dsn

    # -- the store ------------------------------------------------------------------------

    def check_store(self) -> SchemaStatus:
        """Reach the store and check that its schema is current; typed errors
        (ConfigurationError, StoreUnavailable and their kin) name the connection."""
        target = self.get_target()  # its errors already name the connection
        try:
            return target.check()
        except AgentpostError as exc:
            raise _blame(exc, self.agentpost_conn_id, target.source) from None

    def get_store(self, *, check: bool = True) -> EnvelopeStore:
        """A new EnvelopeStore on the connection's database; the caller closes it.

        The first call on a hook checks the store (`check_store`, one short connection), so
        an unreachable or unmigrated store fails here, naming the connection; ``check=False``
        skips the check."""
        if check and not self._checked:
            self.check_store()
            self._checked = True
        return self.get_target().open()

    def get_conn(self) -> EnvelopeStore:
        """BaseHook's name for `get_store`."""
        return self.get_store()

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's Test button (and `airflow connections test`): whether the
        store answers with a current schema, and a one-line message saying so or why not."""
        try:
            status = self.check_store()
        except AgentpostError as exc:
            return False, str(exc)
        return True, f"agentpost connection {self.agentpost_conn_id!r}: {status.summary()}"
