"""What every command group shares: finding the store, printing JSON, reading JSON input,
and turning an error into its one line and exit code.

Store discovery: ``--dsn``, else AGENTPOST_DSN, else the store of the `make demo` running
from this checkout (`agentpost.demo.store`; a note on stderr says so), else Postgres discovery
(a server on 127.0.0.1:5432, else the private cluster under ``.pg/``) with the database
``agentpost``, created and migrated on first use. The store modules are imported when a
command opens its store, so that parsing the arguments (``--help``) stays quick.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from agentpost.protocol.errors import (
    AgentpostError,
    ConfigurationError,
    InvalidInput,
    NotFound,
    StoreError,
    one_line,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
DEFAULT_DATABASE = "agentpost"

EXIT_CODES: Sequence[tuple[type[Exception], int]] = (
    (InvalidInput, EXIT_USAGE),
    (NotFound, EXIT_USAGE),
    (ConfigurationError, EXIT_STORE),
    (StoreError, EXIT_STORE),
    (AgentpostError, EXIT_USAGE),
)


def store_dsn(args: argparse.Namespace) -> str:
    """The DSN of the store the command works on (see the module docstring), remembered on
    `args` so an error can name it; with the trail key a running demo published."""
    if getattr(args, "store_dsn", None):
        return args.store_dsn
    dsn = args.dsn or os.environ.get("AGENTPOST_DSN")
    if not dsn:
        dsn = demo_dsn(args) or discovered_dsn()
    args.store_dsn = dsn
    return dsn


def demo_dsn(args: argparse.Namespace) -> str | None:
    """The DSN a `make demo` running here published (its trail key goes on `args` unless
    AGENTPOST_TRAIL_KEY is set), or None."""
    from agentpost.demo.store import running_demo_store
    from agentpost.pg.server import redact_dsn

    demo = running_demo_store()
    if demo is None:
        return None
    if not os.environ.get("AGENTPOST_TRAIL_KEY"):
        args.trail_key = demo.trail_key
    print(f"agentpost: using the store of the demo running here (pid {demo.pid}): "
          f"{redact_dsn(demo.dsn)}", file=sys.stderr)
    return demo.dsn


def discovered_dsn() -> str:
    """The ``agentpost`` database on the server discovery finds, created and migrated."""
    from agentpost.pg.bootstrap import ensure_database

    return ensure_database(DEFAULT_DATABASE)


def open_store(args: argparse.Namespace) -> Any:
    """The store the command works on (created and migrated when found by discovery)."""
    from agentpost.store import EnvelopeStore

    dsn = store_dsn(args)
    return EnvelopeStore(dsn, trail_key=getattr(args, "trail_key", None))


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def parse_json(text: str, what: str) -> Any:
    """`text` as JSON; invalid JSON is bad input, in one line naming `what`."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


def read_json(source: str, what: str) -> Any:
    """The JSON in the file `source` (- for stdin); unreadable or invalid is bad input."""
    if source == "-":
        return parse_json(sys.stdin.read(), what)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {source}: {exc.strerror}") from None
    return parse_json(text, what)


def exit_code(exc: AgentpostError) -> int:
    """The exit code of an error: 2 for bad usage or input, 3 for the store."""
    return next(code for kind, code in EXIT_CODES if isinstance(exc, kind))


def error_line(args: argparse.Namespace, exc: AgentpostError) -> str:
    """The one line an error prints on stderr; for something missing, with the store it was
    looked for in (its DSN without a password), since "unknown workspace" in the wrong
    database is the usual first-hour puzzle."""
    where = ""
    dsn = getattr(args, "store_dsn", None)
    if isinstance(exc, NotFound) and dsn:
        from agentpost.pg.server import redact_dsn

        where = f" (in the store {redact_dsn(dsn)})"
    return f"agentpost: {one_line(exc)}{where}"
