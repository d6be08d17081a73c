"""agentpost's HTTP/WebSocket gateway (Courier §7.2): enqueue, subscribe with credits and
leases, the latestPerAgent view and its live deltas, stats; capability tokens and rate limits.

``create_app(store_or_dsn)`` builds the FastAPI application; ``agentpost gateway`` serves it
with uvicorn. The import is lazy so that the CLI does not load FastAPI to parse its arguments.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GatewayConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agentpost.gateway import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
