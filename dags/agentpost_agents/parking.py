"""A driver looking for a parking spot in a deferred scope (Markspace §6.2).

Each activation: a driver that holds a spot is done; otherwise it goes through its spots in
order of preference, skipping those another driver's action holds. On a spot, `execute`
writes (or reuses) its intent: BLOCKED while no resolution boundary has decided (it waits
there for the next one), ALLOW once the boundary picked it (it parks, at most once), BLOCKED
with the winner when it lost (it tries the next spot). Confidence and spots come from the
agent's `config` in the fleet file.

A driver that parked withdraws its intents on the other spots (`withdraw`): left alone they
would live out their TTL, and every boundary until then would compare them on spots an
action already holds and record "no winner" for them (P14 counts every active intent, P39
lets none win against an action).
"""

from __future__ import annotations

from typing import Any

from agentpost.marks.core import Intent
from agentpost.marks.guard import Verdict

SCOPE = "parking"


def park(ctx: Any) -> dict[str, Any]:
    me = ctx.agent.id
    spots = list(ctx.config["spots"])
    confidence = float(ctx.config.get("confidence", 1.0))
    held = {spot: [a.agent_id for a in ctx.space.claims(SCOPE, spot)] for spot in spots}
    mine = next((spot for spot, holders in held.items() if me in holders), None)
    if mine is not None:
        withdraw(ctx, spots, keep=mine)  # again, in case the activation that parked died
        return {"parked": mine}
    for spot in (s for s, holders in held.items() if not holders):
        decision, _ = ctx.guard.execute(ctx.agent, SCOPE, spot, "park", "parked",
                                        lambda spot=spot: {"spot": spot}, confidence)
        if decision.verdict is Verdict.ALLOW:
            withdraw(ctx, spots, keep=spot)
            ctx.send("parking.report", "dispatch", {"spot": spot, "driver": ctx.agent.name},
                     format="json")
            return {"parked": spot}
        if decision.winning_intent is None:  # no boundary has decided yet
            return {"waiting": spot}
    return {"parked": None}


def withdraw(ctx: Any, spots: list[str], keep: str) -> int:
    """Withdraw the driver's live intents on every spot but `keep`; returns how many.

    An intent is withdrawn by a zero-strength intent of the driver's own that supersedes it
    (Markspace §10): the old one is invisible from then on, and the new one is never active
    (a boundary collects intents of strength > 0, §6.2.1), so no boundary counts either. A
    withdrawn spot has nothing pending, and boundaries stop deciding about it."""
    withdrawn = 0
    for spot in spots:
        if spot == keep:
            continue
        for intent in ctx.space.get_intents(SCOPE, spot):
            if intent.agent_id == ctx.agent.id and intent.initial_strength > 0:
                ctx.space.write(ctx.agent, Intent(
                    scope=SCOPE, resource=spot, action=intent.action,
                    confidence=intent.confidence, initial_strength=0.0,
                    supersedes=intent.id))
                withdrawn += 1
    return withdrawn
