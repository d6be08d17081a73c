"""The settings of the plugin's MCP endpoint (``/agentpost/mcp``), from the ``[agentpost]``
section of Airflow's configuration (``airflow.cfg``, or ``AIRFLOW__AGENTPOST__<KEY>``):

    mcp_space         a mark space (in the store's database): adds read_marks, write_mark
                      and claim; unset: no mark tools
    mcp_scopes        its scopes, ``NAME[:INTENT_VERBS[:ACTION_VERBS]]`` (verbs
                      comma-separated, as ``agentpost mcp serve --scope``), separated by
                      spaces or new lines
    mcp_fleet         instead of the two above: a fleet file whose ``space`` and ``scopes``
                      are used (scopes with every field of the file: conflict policy,
                      topics, decay...); a fleet without scopes offers no mark tools
    mcp_token_rate    requests per second of a token's bucket when the token has no rate of
                      its own; ``off``: no limit (default: the gateway's, 50)
    mcp_token_burst   that bucket's size (default: the gateway's, 100)
    mcp_token_cache   seconds a token the store confirmed live is taken as live without
                      asking the store again, so a revoked token is refused within that
                      time; 0: ask on every request (default: 1)

Read on the endpoint's first request (`airflow_mcp_options`), not when Airflow imports the
plugin: a wrong setting then fails the endpoint alone (500 to signed callers, the reason in
the API server's log), not the plugin's page and links with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from agentpost.protocol.errors import ConfigurationError, InvalidInput

SECTION = "agentpost"
KEYS = ("mcp_space", "mcp_scopes", "mcp_fleet", "mcp_token_rate", "mcp_token_burst",
        "mcp_token_cache")
_OFF = {"off", "none"}


def _setting(conf: Any, key: str) -> str | None:
    value = conf.get(SECTION, key, fallback=None)
    return value.strip() if isinstance(value, str) and value.strip() else None


def options_from(settings: dict[str, str | None]) -> dict[str, Any]:
    """`MCPEndpoint`'s keyword arguments from the settings (`KEYS`, None when unset);
    ConfigurationError naming the setting that is wrong."""
    space, scopes, fleet = (settings.get(k) for k in ("mcp_space", "mcp_scopes", "mcp_fleet"))
    options: dict[str, Any] = {}
    if fleet is not None:
        if space is not None or scopes is not None:
            raise ConfigurationError(f"[{SECTION}] mcp_fleet gives the mark space and its "
                                     "scopes: leave mcp_space and mcp_scopes unset")
        from agentpost.fleet import FleetError, load_fleet

        try:
            loaded = load_fleet(fleet)
        except FleetError as exc:
            raise ConfigurationError(f"[{SECTION}] mcp_fleet: {exc}") from None
        if loaded.scopes:
            options.update(space=loaded.space, scopes=list(loaded.scopes))
    elif space is not None:
        from agentpost.mcpserver.seat import parse_scope

        try:
            parsed = [parse_scope(text) for text in (scopes or "").split()]
        except InvalidInput as exc:
            raise ConfigurationError(f"[{SECTION}] mcp_scopes: {exc}") from None
        options.update(space=space, scopes=parsed)
    elif scopes is not None:
        raise ConfigurationError(f"[{SECTION}] mcp_scopes needs mcp_space (the mark space "
                                 "the scopes are of)")
    rate, burst = settings.get("mcp_token_rate"), settings.get("mcp_token_burst")
    if rate is not None:
        options["token_rate"] = None if rate.lower() in _OFF else _rate(rate)
    if burst is not None:
        options["token_burst"] = _burst(burst)
    cache = settings.get("mcp_token_cache")
    if cache is not None:
        options["token_cache"] = _seconds(cache)
    return options


def _number(text: str, option: str, hint: str, ok: Callable[[float], bool], *,
            whole: bool = False) -> float:
    """`text` as a finite number `ok` accepts (a whole one with `whole`), or a
    ConfigurationError naming the option and what to use (`hint`)."""
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise ConfigurationError(f"[{SECTION}] {option} = {text!r}: use {hint}")
    return value


def _rate(text: str) -> float:
    return _number(text, "mcp_token_rate", "a positive number of requests per second, or off",
                   lambda v: v > 0)


def _burst(text: str) -> int:
    return int(_number(text, "mcp_token_burst", "a whole number of requests, at least 1",
                       lambda v: v >= 1, whole=True))


def _seconds(text: str) -> float:
    return _number(text, "mcp_token_cache", "a number of seconds, 0 or more (0: no cache)",
                   lambda v: v >= 0)


def airflow_mcp_options() -> dict[str, Any]:
    """The endpoint's keyword arguments from the ``[agentpost]`` section of Airflow's
    configuration (`options_from`)."""
    from airflow.configuration import conf

    return options_from({key: _setting(conf, key) for key in KEYS})
