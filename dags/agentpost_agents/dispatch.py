"""A reactive agent: runs when its inbox (dispatch) has envelopes, and consumes them."""

from __future__ import annotations

from typing import Any


def read_reports(ctx: Any) -> dict[str, Any]:
    envelopes = ctx.store.inbox(ctx.workspace_id, limit=100)
    for envelope in envelopes:
        ctx.store.consume(ctx.workspace_id, envelope.id)
    return {"read": [e.type for e in envelopes]}
