"""The terminal demo: a coordinator and two workers talk through the store.

It runs against a fresh database ``agentpost_demo_terminal`` on the server discovery finds
(or on ``dsn``), narrates each step, prints the trail and verifies it. Its database is its
own: `make demo`'s store (``agentpost_demo``) is never touched, and a database someone is
connected to is never dropped (`agentpost.demo.store`).
"""

from __future__ import annotations

import json

from agentpost.demo.store import TERMINAL_DATABASE, demo_trail_key
from agentpost.pg.bootstrap import create_database, find_server
from agentpost.pg.migrations import migrate
from agentpost.pg.server import redact_dsn
from agentpost.protocol.trail import format_trail_event
from agentpost.store import EnvelopeStore

DEMO_DATABASE = TERMINAL_DATABASE


def _say(text: str) -> None:
    print(f"  {text}")


def _step(title: str) -> None:
    print(f"\n== {title}")


def run_demo(dsn: str | None = None) -> int:
    """The scenario on `dsn`, or on a fresh database of its own signed with a generated
    key (unless AGENTPOST_TRAIL_KEY is set)."""
    if dsn is None:
        server = find_server()
        dsn = create_database(server.dsn, DEMO_DATABASE, fresh=True)
        shown = redact_dsn(dsn)
        print(f"agentpost demo: using a fresh database {DEMO_DATABASE!r} ({server.source} "
              f"Postgres): {shown}\n  look at it again with: agentpost --dsn '{shown}' trail")
        if demo_trail_key():
            print("  (its trail is signed with a key generated for this run: set "
                  "AGENTPOST_TRAIL_KEY before the demo to verify it later)")
    migrate(dsn)
    with EnvelopeStore(dsn) as store:
        return _scenario(store)


def _scenario(store: EnvelopeStore) -> int:
    _step("A coordinator and two workers")
    lead = store.create_workspace("coordinator", workspace_id="lead", originator="dana")
    a = store.create_workspace("worker", parent=lead.id, workspace_id="worker-a")
    b = store.create_workspace("worker", parent=lead.id, workspace_id="worker-b")
    for ws in (lead, a, b):
        _say(f"{ws.id:<9} role={ws.role:<12} originator={ws.originator}")

    _step("The coordinator hands out directives")
    d1 = store.send(lead.id, a.id, "directive", "Summarise the Q3 incident reports.")
    d2 = store.send(lead.id, b.id, "directive", "Draft the customer notice for incident 42.")
    for to, res in ((a.id, d1), (b.id, d2)):
        _say(f"lead -> {to}: directive {res.envelope_id[:8]} {res.status}")

    _step("worker-a has a question")
    q = store.send(a.id, lead.id, "query", "Include incidents still under review?",
                   in_reply_to=d1.envelope_id, priority="urgent")
    _say(f"worker-a -> lead: query {q.envelope_id[:8]} {q.status}")
    for env in store.inbox(lead.id):
        _say(f"lead reads ({env.priority}): {env.content!r}")
        store.consume(lead.id, env.id)
    f = store.send(lead.id, a.id, "feedback", "Yes, mark them as provisional.",
                   in_reply_to=q.envelope_id)
    _say(f"lead -> worker-a: feedback {f.envelope_id[:8]} {f.status}")

    _step("A worker tries to give the coordinator orders")
    bad = store.send(b.id, lead.id, "directive", "Approve my draft now.")
    _say(f"worker-b -> lead: directive {bad.status}, reason: {bad.reason}")
    for sig in store.signals(b.id):
        _say(f"worker-b is told: {sig.signal} {sig.ref[:8] if sig.ref else ''} "
             f"{sig.reason or ''}".rstrip())

    _step("The workers read their inboxes, in order")
    for ws in (a, b):
        for env in store.inbox(ws.id):
            _say(f"{ws.id} reads {env.type} from {env.from_}: {env.content!r}")
            store.consume(ws.id, env.id)

    _step("Acknowledgments the coordinator received")
    for sig in store.signals(lead.id):
        _say(f"{sig.signal:<12} ref={sig.ref[:8] if sig.ref else '-'} from {sig.emitted_by}")

    _step("The trail (no payloads, each entry hash-chained and signed)")
    for event in store.trail():
        print("  " + format_trail_event(event))

    _step("Verifying the trail")
    result = store.verify_trail()
    _say(json.dumps(result.model_dump(exclude_none=True)))
    return 0 if result.ok else 1
