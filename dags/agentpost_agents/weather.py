"""A source agent (Markspace §14): nothing upstream wakes it, its schedule does. Each
activation observes the weather and tells the dispatcher."""

from __future__ import annotations

from typing import Any

from agentpost.marks import Observation


def poll(ctx: Any) -> dict[str, Any]:
    forecast = {"sky": "clear", "run": ctx.airflow.get("run_id")}  # a stand-in for a real API
    mark_id = ctx.guard.write_mark(ctx.agent, Observation(scope="weather", topic="forecast",
                                                          content=forecast))
    ctx.send("weather.update", "dispatch", forecast, format="json")
    return {"observation": str(mark_id)}
