"""A driver looking for a parking spot in a deferred scope (Markspace §6.2).

Each activation: a driver that holds a spot is done; otherwise it goes through its spots in
order of preference, skipping those another driver's action holds. On a spot, `execute`
writes (or reuses) its intent: BLOCKED while no resolution boundary has decided (it waits
there for the next one), ALLOW once the boundary picked it (it parks, at most once), BLOCKED
with the winner when it lost (it tries the next spot). Confidence and spots come from the
agent's `config` in the fleet file.
"""

from __future__ import annotations

from typing import Any

from agentpost.marks.guard import Verdict

SCOPE = "parking"


def park(ctx: Any) -> dict[str, Any]:
    me = ctx.agent.id
    spots = list(ctx.config["spots"])
    confidence = float(ctx.config.get("confidence", 1.0))
    held = {spot: [a.agent_id for a in ctx.space.claims(SCOPE, spot)] for spot in spots}
    mine = next((spot for spot, holders in held.items() if me in holders), None)
    if mine is not None:
        return {"parked": mine}
    for spot in (s for s, holders in held.items() if not holders):
        decision, _ = ctx.guard.execute(ctx.agent, SCOPE, spot, "park", "parked",
                                        lambda spot=spot: {"spot": spot}, confidence)
        if decision.verdict is Verdict.ALLOW:
            ctx.send("parking.report", "dispatch", {"spot": spot, "driver": ctx.agent.name},
                     format="json")
            return {"parked": spot}
        if decision.winning_intent is None:  # no boundary has decided yet
            return {"waiting": spot}
    return {"parked": None}
