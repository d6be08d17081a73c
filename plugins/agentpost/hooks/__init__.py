"""Hooks, laid out as Airflow's own providers lay them out (``<provider>.hooks.<name>``).

``from agentpost.hooks import AgentpostHook`` is the public import; the class lives in
`agentpost.hooks.agentpost`.
"""

from __future__ import annotations

from agentpost.hooks.agentpost import AgentpostHook, StoreTarget, dsn_from_connection

__all__ = ["AgentpostHook", "StoreTarget", "dsn_from_connection"]
