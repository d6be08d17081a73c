"""The HTTP/WebSocket gateway (issue requirement: "A FastAPI app (`agentpost.gateway`) with the
spec's §7.2 interface"), served by a real uvicorn server on loopback and driven by a real HTTP
client (httpx) and a real WebSocket client (websockets), against real Postgres.

Courier sections: §7.2 (enqueue, subscribe with credit/ack/nack), §9 (snapshot and live view),
§10 (stats), §11 (error codes), §12 (capability tokens, token buckets).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from agentpost.cli import main as cli_main
from agentpost.gateway import create_app
from agentpost.gateway.core import is_loopback
from agentpost.gateway.tokens import TokenStore
from agentpost.store import EnvelopeStore
from dbtools import query

WAIT = 10.0  # seconds a test waits for something that should come promptly
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/x"


class Served:
    """A uvicorn server for `app` on 127.0.0.1 and a free port, in a background thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            assert self.thread.is_alive(), "the gateway did not start"
            assert time.monotonic() < deadline, "the gateway did not start in time"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)
        self.sock.close()


@pytest.fixture(scope="module")
def store(module_dsn: str) -> Iterator[EnvelopeStore]:
    with EnvelopeStore(module_dsn, ack_timeout=0.2) as s:
        s.register_type("task", ["coordinator"], ["worker"])
        yield s


@pytest.fixture(scope="module")
def tokens(store: EnvelopeStore) -> TokenStore:
    return TokenStore(store)


@pytest.fixture(scope="module")
def gateway(store: EnvelopeStore) -> Iterator[Served]:
    with Served(create_app(store, poll_interval=0.5, live_poll_interval=2.0)) as served:
        yield served


@pytest.fixture(scope="module")
def admin(tokens: TokenStore) -> str:
    """A secret with every scope."""
    return tokens.create("admin", ["streams:*:enqueue", "senders:*:send",
                                   "streams:*:subscribe", "views:*:read",
                                   "stats:*:read"])[1]


@pytest.fixture
def client(gateway: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.http, timeout=WAIT, trust_env=False) as c:
        yield c


@dataclass
class World:
    """A coordinator and its worker, fresh per test (names never collide in the module)."""

    boss: str
    worker: str

    @property
    def inbox(self) -> str:
        return f"agents/{self.worker}/inbox"


@pytest.fixture
def world(store: EnvelopeStore) -> World:
    tag = uuid.uuid4().hex[:8]
    boss = store.create_workspace("coordinator", workspace_id=f"boss-{tag}").id
    worker = store.create_workspace("worker", parent=boss, workspace_id=f"w-{tag}").id
    return World(boss, worker)


def courier(sender: str, *, eid: str | None = None, type_: str = "task",
            payload: Any = None) -> dict[str, Any]:
    """A Courier §4.1 envelope."""
    return {"id": eid or f"e-{uuid.uuid4().hex[:12]}", "ts": datetime.now(UTC).isoformat(),
            "from": sender, "type": type_, "payload": payload or {"title": "do it"}}


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def enqueue(client: httpx.Client, secret: str, to: str, envelope: dict[str, Any]
            ) -> httpx.Response:
    return client.post("/v1/enqueue", json={"to": to, "envelope": envelope},
                       headers=auth(secret))


def assert_error(response: httpx.Response, code: int) -> str:
    """The §11 error shape, with the status, and nothing of a traceback or SQL."""
    assert response.status_code == code, response.text
    body = response.json()
    assert body["error"]["code"] == code
    message = body["error"]["message"]
    assert "Traceback" not in response.text and "psycopg2" not in response.text
    return message


@contextlib.contextmanager
def subscribe(gateway: Served, secret: str | None, stream: str, *, ttl: float | None = None
              ) -> Iterator[ClientConnection]:
    url = f"{gateway.ws}/v1/subscribe?stream={stream}"
    if ttl is not None:
        url += f"&ttl={ttl}"
    headers = auth(secret) if secret else {}
    with connect(url, additional_headers=headers, proxy=None, open_timeout=WAIT) as ws:
        yield ws


def recv(ws: ClientConnection, timeout: float = WAIT) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def assert_silent(ws: ClientConnection, seconds: float = 0.6) -> None:
    """Nothing arrives for a while (used only to show that nothing is pushed)."""
    with pytest.raises(TimeoutError):
        ws.recv(timeout=seconds)


def send(ws: ClientConnection, frame: Any) -> None:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))


def in_flight(store: EnvelopeStore, workspace: str) -> int:
    return store.stats(workspace).in_flight


def eventually(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- POST /v1/enqueue -----------------------------------------------------------------------


def test_enqueue_delivers_to_the_stream(client: httpx.Client, admin: str, world: World,
                                        store: EnvelopeStore) -> None:
    """Courier §7.2 POST /v1/enqueue {to, envelope} -> {id}: the envelope lands in the inbox."""
    env = courier(world.boss, payload={"wave": "B"})
    response = enqueue(client, admin, world.inbox, env)
    assert response.status_code == 200, response.text
    assert response.json() == {"id": env["id"], "status": "acknowledged", "duplicate": False}
    (got,) = store.inbox(world.worker)
    assert got.id == env["id"] and json.loads(got.content) == {"wave": "B"}


def test_enqueue_same_id_is_a_duplicate(client: httpx.Client, admin: str, world: World,
                                        store: EnvelopeStore) -> None:
    """Courier §6.4: the envelope id is the idempotency key; a resend is reported, not sent."""
    env = courier(world.boss)
    assert enqueue(client, admin, world.inbox, env).json()["duplicate"] is False
    again = enqueue(client, admin, world.inbox, env)
    assert again.status_code == 200
    assert again.json() == {"id": env["id"], "status": "acknowledged", "duplicate": True}
    assert [e.id for e in store.inbox(world.worker)] == [env["id"]]


@pytest.mark.parametrize("body", [
    "not json",
    json.dumps([1, 2]),
    json.dumps({"to": "agents/x/inbox"}),
    json.dumps({"to": "agents/x/inbox", "envelope": {"id": "e1"}, "extra": 1}),
])
def test_enqueue_malformed_body_is_400(client: httpx.Client, admin: str, body: str) -> None:
    """Courier §11: validation errors -> 400."""
    response = client.post("/v1/enqueue", content=body, headers=auth(admin))
    assert_error(response, 400)


def test_enqueue_invalid_envelope_is_400(client: httpx.Client, admin: str, world: World,
                                         store: EnvelopeStore) -> None:
    """Courier §4.1 validation (required fields, no unknown fields, a well-formed stream)
    -> 400 (§11), and nothing is stored."""
    missing = courier(world.boss)
    del missing["payload"]
    assert "payload" in assert_error(enqueue(client, admin, world.inbox, missing), 400)
    unknown = {**courier(world.boss), "colour": "red"}
    assert_error(enqueue(client, admin, world.inbox, unknown), 400)
    assert_error(enqueue(client, admin, "agents/a/b/inbox", courier(world.boss)), 400)
    assert store.inbox(world.worker) == []


def test_enqueue_to_unknown_stream_is_404(client: httpx.Client, admin: str,
                                          world: World) -> None:
    """Courier §11: unknown stream -> 404."""
    message = assert_error(enqueue(client, admin, "agents/nobody-here/inbox",
                                   courier(world.boss)), 404)
    assert "agents/nobody-here/inbox" in message


def test_enqueue_rejected_by_wacp_is_422_with_the_reason(
        client: httpx.Client, admin: str, world: World, store: EnvelopeStore) -> None:
    """A WACP rejection (the worker may not send a task to its coordinator: the matrix says
    coordinator -> worker) is 422 with status "rejected" and the §9 reason in the body."""
    env = courier(world.worker)
    response = enqueue(client, admin, f"agents/{world.boss}/inbox", env)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["id"] == env["id"] and body["status"] == "rejected"
    assert body["reason"] == "permission_denied"
    assert body["error"]["code"] == 422
    assert store.inbox(world.boss) == []


# -- auth and scopes ----------------------------------------------------------------------


def test_enqueue_without_a_valid_token_is_401(client: httpx.Client, tokens: TokenStore,
                                               world: World) -> None:
    """Courier §12 capability tokens: no token, an unknown one, a revoked one -> 401."""
    body = {"to": world.inbox, "envelope": courier(world.boss)}
    assert_error(client.post("/v1/enqueue", json=body), 401)
    assert_error(client.post("/v1/enqueue", json=body, headers=auth("apgw_" + "x" * 43)), 401)
    assert_error(client.post("/v1/enqueue", json=body,
                             headers={"Authorization": "Basic dXNlcjpwdw=="}), 401)
    info, secret = tokens.create("short-lived", ["streams:*:enqueue", "senders:*:send"])
    assert client.post("/v1/enqueue", json=body, headers=auth(secret)).status_code == 200
    tokens.revoke(info.id)
    assert_error(client.post("/v1/enqueue", json={"to": world.inbox,
                                                   "envelope": courier(world.boss)},
                             headers=auth(secret)), 401)


def test_scopes_limit_streams_and_actions(client: httpx.Client, tokens: TokenStore,
                                          world: World, store: EnvelopeStore) -> None:
    """Courier §12: `streams:<pattern>:enqueue` grants enqueueing to matching streams only;
    a subscribe or view scope does not grant it -> 403."""
    _, only_here = tokens.create("one-stream", [f"streams:{world.inbox}:enqueue",
                                                f"senders:{world.boss}:send"])
    _, subscriber = tokens.create("subscriber", ["streams:*:subscribe", "views:*:read"])
    other = store.create_workspace("worker", parent=world.boss).id
    assert enqueue(client, only_here, world.inbox, courier(world.boss)).status_code == 200
    assert "lacks" in assert_error(
        enqueue(client, only_here, f"agents/{other}/inbox", courier(world.boss)), 403)
    assert_error(enqueue(client, subscriber, world.inbox, courier(world.boss)), 403)
    _, pattern = tokens.create("pattern", ["streams:agents/w-*/inbox:enqueue", "senders:*:send"])
    assert enqueue(client, pattern, world.inbox, courier(world.boss)).status_code == 200


def test_senders_scope_limits_whom_an_enqueue_may_speak_for(
        client: httpx.Client, tokens: TokenStore, world: World, store: EnvelopeStore) -> None:
    """Courier §12 capability tokens: `senders:<pattern>:send` says which workspaces (or
    human:<user>) a token may name in `from`; a stream scope alone does not let a caller
    speak for anyone, and a refusal sends nothing."""
    _, no_sender = tokens.create("no-sender", ["streams:*:enqueue"])
    _, as_human = tokens.create("as-human", ["streams:*:enqueue", "senders:human:*:send"])
    _, as_boss = tokens.create("as-boss", ["streams:*:enqueue", f"senders:{world.boss}:send"])
    env = courier(world.boss)
    assert "lacks" in assert_error(enqueue(client, no_sender, world.inbox, env), 403)
    assert "lacks" in assert_error(enqueue(client, as_human, world.inbox, env), 403)
    outbox = dict(env, **{"from": f"agents/{world.boss}/outbox"})
    assert "lacks" in assert_error(enqueue(client, as_human, world.inbox, outbox), 403)
    assert store.inbox(world.worker) == []
    assert enqueue(client, as_human, world.inbox, courier("human:dana")).status_code == 200
    assert enqueue(client, as_boss, world.inbox, outbox).status_code == 200
    assert sorted(e.from_ for e in store.inbox(world.worker)) == [world.boss, "human:dana"]


def test_tokens_are_hashed_at_rest(tokens: TokenStore, module_dsn: str) -> None:
    """Capability tokens "hashed at rest": no column of the table holds the secret, only its
    SHA-256."""
    info, secret = tokens.create("hashed", ["views:*:read"])
    (row,) = query(module_dsn, "SELECT to_jsonb(t)::text, secret_hash FROM "
                               "agentpost.gateway_tokens t WHERE id = %s", (info.id,))
    assert secret not in row[0]
    assert secret.removeprefix("apgw_") not in row[0]
    assert bytes(row[1]) == hashlib.sha256(secret.encode()).digest()
    assert tokens.authenticate(secret) == info


def test_bad_scopes_are_refused_at_creation(tokens: TokenStore) -> None:
    from agentpost.protocol.errors import InvalidInput

    for scope in ["streams:*:read", "views:*:enqueue", "nope:*:read", "streams::enqueue",
                  "streams:*", ""]:
        with pytest.raises(InvalidInput):
            tokens.create("bad", [scope])
    with pytest.raises(InvalidInput):
        tokens.create("none", [])


# -- snapshot and stats -------------------------------------------------------------------


def test_snapshot_latest_per_agent(client: httpx.Client, admin: str, world: World) -> None:
    """Courier §9: GET /v1/snapshot?view=latestPerAgent maps each inbox to its last envelope."""
    first, last = courier(world.boss), courier(world.boss, payload={"n": 2})
    enqueue(client, admin, world.inbox, first)
    enqueue(client, admin, world.inbox, last)
    response = client.get("/v1/snapshot", params={"view": "latestPerAgent"},
                          headers=auth(admin))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["view"] == "latestPerAgent"
    entry = body["snapshot"][world.inbox]
    assert entry["id"] == last["id"] and entry["payload"] == {"n": 2}
    assert entry["to"] == world.inbox and entry["from"] == world.boss


def test_snapshot_errors(client: httpx.Client, admin: str, tokens: TokenStore) -> None:
    """Courier §11 on the snapshot: no view named -> 400, an unknown view -> 404, a token
    without a views scope -> 403."""
    assert_error(client.get("/v1/snapshot", headers=auth(admin)), 400)
    assert_error(client.get("/v1/snapshot", params={"view": "nope"}, headers=auth(admin)), 404)
    _, no_views = tokens.create("no-views", ["stats:*:read"])
    assert_error(client.get("/v1/snapshot", params={"view": "latestPerAgent"},
                            headers=auth(no_views)), 403)


def test_stats_of_a_stream(client: httpx.Client, admin: str, world: World,
                           tokens: TokenStore) -> None:
    """Courier §7.1/§10 stats over HTTP: depth, in-flight, counters; unknown stream -> 404;
    the list holds only the streams the token may read."""
    for _ in range(3):
        enqueue(client, admin, world.inbox, courier(world.boss))
    response = client.get("/v1/stats", params={"stream": world.inbox}, headers=auth(admin))
    assert response.status_code == 200, response.text
    stats = response.json()
    assert stats["stream"] == world.inbox and stats["depth"] == 3
    assert stats["in_flight"] == 0 and stats["enqueued"] == 3
    assert_error(client.get("/v1/stats", params={"stream": "agents/nobody/inbox"},
                            headers=auth(admin)), 404)
    _, narrow = tokens.create("narrow-stats", [f"stats:{world.inbox}:read"])
    listed = client.get("/v1/stats", headers=auth(narrow)).json()["streams"]
    assert [s["stream"] for s in listed] == [world.inbox]
    assert_error(client.get("/v1/stats", params={"stream": f"agents/{world.boss}/inbox"},
                            headers=auth(narrow)), 403)


def test_unknown_route_keeps_the_error_shape(client: httpx.Client, admin: str) -> None:
    """Errors keep the §11 shape for routes that do not exist."""
    assert_error(client.get("/v1/nothing", headers=auth(admin)), 404)
    assert_error(client.get("/v1/enqueue", headers=auth(admin)), 405)


# -- WS /v1/subscribe ---------------------------------------------------------------------


def test_subscribe_delivers_nothing_without_credit(gateway: Served, client: httpx.Client,
                                                   admin: str, world: World,
                                                   store: EnvelopeStore) -> None:
    """Courier §6.2: subscribers start with credit 0 and nothing is pushed until they grant
    some; a delivery carries the Courier envelope and its lease."""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox) as ws:
        assert_silent(ws)
        assert in_flight(store, world.worker) == 0
        send(ws, {"credit": 1})
        frame = recv(ws)["deliver"]
        assert frame["id"] == env["id"] and frame["to"] == world.inbox
        assert frame["payload"] == env["payload"]
        assert frame["lease"]["attempt"] == 1
        assert datetime.fromisoformat(frame["lease"]["expires_at"]) > datetime.now(UTC)
        assert in_flight(store, world.worker) == 1


def test_credit_n_delivers_at_most_n(gateway: Served, client: httpx.Client, admin: str,
                                     world: World, store: EnvelopeStore) -> None:
    """Courier §6.2: the server decrements credit on delivery and stops at 0; it resumes when
    credit is granted again."""
    ids = [courier(world.boss) for _ in range(3)]
    for env in ids:
        enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 2})
        got = [recv(ws)["deliver"]["id"] for _ in range(2)]
        assert got == [ids[0]["id"], ids[1]["id"]]  # FIFO (§6.1)
        assert_silent(ws)
        assert in_flight(store, world.worker) == 2
        send(ws, {"credit": 5})
        assert recv(ws)["deliver"]["id"] == ids[2]["id"]


def test_ack_consumes_and_a_second_ack_is_409(gateway: Served, client: httpx.Client,
                                              admin: str, world: World,
                                              store: EnvelopeStore) -> None:
    """Courier §6.3 ack removes the lease; §11 lease errors (double ack) -> 409 error frame,
    and the session stays usable."""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 1})
        assert recv(ws)["deliver"]["id"] == env["id"]
        send(ws, {"ack": env["id"]})
        assert recv(ws) == {"acked": env["id"]}
        assert store.get(env["id"]).consumed_at is not None
        assert in_flight(store, world.worker) == 0
        send(ws, {"ack": env["id"]})
        assert recv(ws)["error"]["code"] == 409
        send(ws, {"ack": "never-delivered"})
        assert recv(ws)["error"]["code"] == 409
        later = courier(world.boss)
        enqueue(client, admin, world.inbox, later)
        send(ws, {"credit": 1})
        assert recv(ws)["deliver"]["id"] == later["id"]


def test_nack_redelivers(gateway: Served, client: httpx.Client, admin: str, world: World,
                         store: EnvelopeStore) -> None:
    """Courier §6.3: a nack removes the lease and re-enqueues; with credit left the envelope
    comes again, as attempt 2."""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 2})
        assert recv(ws)["deliver"]["lease"]["attempt"] == 1
        send(ws, {"nack": env["id"]})
        frames = [recv(ws), recv(ws)]
        assert [f["nacked"] for f in frames if "nacked" in f] == [env["id"]]
        (again,) = [f["deliver"] for f in frames if "deliver" in f]
        assert again["id"] == env["id"] and again["lease"]["attempt"] == 2
        send(ws, {"ack": env["id"]})
        assert recv(ws) == {"acked": env["id"]}


def test_nack_with_delay_holds_the_envelope_back(gateway: Served, client: httpx.Client,
                                                 admin: str, world: World,
                                                 store: EnvelopeStore) -> None:
    """Courier §6.3 "nack ... with optional delay": not redelivered within the delay."""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 2})
        recv(ws)
        send(ws, {"nack": env["id"], "delay": 3600})
        assert recv(ws)["nacked"] == env["id"]
        assert_silent(ws)
    assert store.stats(world.worker).delayed == 1


def test_expired_lease_ack_is_409_and_the_envelope_comes_again(
        gateway: Served, client: httpx.Client, admin: str, world: World) -> None:
    """Courier §6.3 "Timeout: lease expiry triggers redelivery"; §11 an ack on a lease that
    is gone -> 409 frame. (The sleep only outlasts the 0.3 s TTL; nothing is timed.)"""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox, ttl=0.3) as ws:
        send(ws, {"credit": 1})
        assert recv(ws)["deliver"]["lease"]["attempt"] == 1
        time.sleep(0.6)
        send(ws, {"ack": env["id"]})
        assert recv(ws)["error"]["code"] == 409
        send(ws, {"credit": 1})
        again = recv(ws)["deliver"]
        assert again["id"] == env["id"] and again["lease"]["attempt"] == 2
        send(ws, {"ack": env["id"]})
        assert recv(ws) == {"acked": env["id"]}


@pytest.mark.parametrize("frame", [
    "not json", {"credit": -1}, {"credit": "3"}, {"credit": True}, {"hello": 1},
    {"credit": 1, "ack": "x"}, [1], {"ack": 5}, {"nack": "x", "delay": "soon"},
])
def test_bad_frame_is_a_400_frame(gateway: Served, admin: str, world: World,
                                  frame: Any) -> None:
    """Courier §11: validation errors -> error frame (code 400); the connection stays open."""
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, frame)
        error = recv(ws)["error"]
        assert error["code"] == 400 and "Traceback" not in error["message"]
        send(ws, {"credit": 0})
        send(ws, {"ack": "nothing"})
        assert recv(ws)["error"]["code"] == 409  # still served


def test_credit_over_quota_is_a_429_frame(gateway: Served, admin: str, world: World) -> None:
    """Courier §11 "over-quota -> 429 / back-off guidance": credit plus unacked deliveries is
    capped per connection; the grant is refused and the frame says the limit."""
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 1001})
        error = recv(ws)["error"]
        assert error["code"] == 429 and error["limit"] == 1000


@pytest.mark.parametrize("stream,secret_kind,code", [
    ("agents/nobody-here/inbox", "admin", 4404),
    (None, "admin", 4400),
    ("WORKER", None, 4401),
    ("WORKER", "enqueue-only", 4403),
])
def test_subscribe_refusals_close_with_4000_plus_status(
        gateway: Served, admin: str, tokens: TokenStore, world: World, stream: str | None,
        secret_kind: str | None, code: int) -> None:
    """Courier §11 on WS: unknown stream -> 404 error frame, no token -> 401, no subscribe
    scope -> 403, no stream -> 400; then the socket closes with 4000 + status."""
    secrets = {"admin": admin, None: None,
               "enqueue-only": tokens.create("enq", ["streams:*:enqueue"])[1]}
    url = f"{gateway.ws}/v1/subscribe"
    if stream is not None:
        url += f"?stream={world.inbox if stream == 'WORKER' else stream}"
    secret = secrets[secret_kind]
    headers = auth(secret) if secret else {}
    with connect(url, additional_headers=headers, proxy=None, open_timeout=WAIT) as ws:
        assert recv(ws)["error"]["code"] == code - 4000
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


def test_leases_of_a_closed_connection_are_returned(gateway: Served, client: httpx.Client,
                                                    admin: str, world: World,
                                                    store: EnvelopeStore) -> None:
    """A connection that closes holding leases nacks them (documented choice): the envelope
    is leasable again at once, as attempt 2, without waiting for the TTL."""
    env = courier(world.boss)
    enqueue(client, admin, world.inbox, env)
    with subscribe(gateway, admin, world.inbox, ttl=3600) as ws:
        send(ws, {"credit": 1})
        assert recv(ws)["deliver"]["id"] == env["id"]
    eventually(lambda: in_flight(store, world.worker) == 0, "the lease to be returned")
    (lease,) = store.lease(world.worker, max=1, ttl=5)
    assert lease.envelope_id == env["id"] and lease.attempt == 2
    store.ack(lease.token)


def test_subscriber_waiting_with_credit_gets_new_envelopes(
        gateway: Served, client: httpx.Client, admin: str, world: World) -> None:
    """Live delivery (AsyncListener): a subscriber with credit and an empty inbox receives an
    envelope enqueued after it subscribed."""
    with subscribe(gateway, admin, world.inbox) as ws:
        send(ws, {"credit": 3})
        assert_silent(ws, 0.3)
        env = courier(world.boss)
        enqueue(client, admin, world.inbox, env)
        assert recv(ws)["deliver"]["id"] == env["id"]


def test_sessions_are_woken_by_listen_not_by_polling(store: EnvelopeStore, admin: str,
                                                     world: World) -> None:
    """Deliveries and live deltas are driven by AsyncListener (LISTEN/NOTIFY): with the poll
    fallback set to an hour, an envelope enqueued after subscribing still arrives."""
    app = create_app(store, poll_interval=3600, live_poll_interval=3600)
    with Served(app) as served, httpx.Client(base_url=served.http, timeout=WAIT,
                                             trust_env=False) as c:
        live_url = f"{served.ws}/v1/live?view=latestPerAgent"
        with subscribe(served, admin, world.inbox) as ws, connect(
                live_url, additional_headers=auth(admin), proxy=None,
                open_timeout=WAIT) as live:
            assert "snapshot" in recv(live)
            send(ws, {"credit": 1})
            send(ws, {"ack": "sync"})  # answered after the credit frame was handled
            assert recv(ws)["error"]["code"] == 409
            env = courier(world.boss)
            assert enqueue(c, admin, world.inbox, env).status_code == 200
            assert recv(ws)["deliver"]["id"] == env["id"]
            assert recv(live)["delta"][world.inbox]["id"] == env["id"]


# -- WS /v1/live --------------------------------------------------------------------------


def test_live_view_sends_snapshot_then_delta(gateway: Served, client: httpx.Client,
                                             admin: str, world: World) -> None:
    """Courier §9 phase 2: /v1/live?view=latestPerAgent sends the snapshot, then
    {"delta": {stream: envelope}} when an inbox changes."""
    first = courier(world.boss)
    enqueue(client, admin, world.inbox, first)
    url = f"{gateway.ws}/v1/live?view=latestPerAgent"
    with connect(url, additional_headers=auth(admin), proxy=None, open_timeout=WAIT) as ws:
        snapshot = recv(ws)
        assert snapshot["view"] == "latestPerAgent"
        assert snapshot["snapshot"][world.inbox]["id"] == first["id"]
        env = courier(world.boss, payload={"n": "live"})
        enqueue(client, admin, world.inbox, env)
        deadline = time.monotonic() + WAIT
        while True:
            delta = recv(ws, timeout=max(0.1, deadline - time.monotonic()))["delta"]
            if world.inbox in delta:
                break
        assert delta[world.inbox]["id"] == env["id"]
        assert delta[world.inbox]["payload"] == {"n": "live"}


def test_live_view_refusals(gateway: Served, tokens: TokenStore, admin: str) -> None:
    """Courier §11 on the live view: unknown view -> 404 frame, no views scope -> 403."""
    _, no_views = tokens.create("live-no-views", ["streams:*:subscribe"])
    for view, secret, code in [("nope", admin, 404), ("latestPerAgent", no_views, 403)]:
        url = f"{gateway.ws}/v1/live?view={view}"
        with connect(url, additional_headers=auth(secret), proxy=None,
                     open_timeout=WAIT) as ws:
            assert recv(ws)["error"]["code"] == code


# -- rate limits and the localhost mode ----------------------------------------------------


def test_token_bucket_429_with_retry_after(client: httpx.Client, tokens: TokenStore,
                                           world: World) -> None:
    """Courier §12 token bucket per token; §11 over quota -> 429 with back-off guidance
    (Retry-After)."""
    _, slow = tokens.create("slow", ["views:*:read"], rate=0.01, burst=2)
    params = {"view": "latestPerAgent"}
    assert [client.get("/v1/snapshot", params=params, headers=auth(slow)).status_code
            for _ in range(2)] == [200, 200]
    refused = client.get("/v1/snapshot", params=params, headers=auth(slow))
    assert_error(refused, 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["retry_after"] > 0


def test_stream_bucket_429(store: EnvelopeStore, tokens: TokenStore, admin: str,
                           world: World) -> None:
    """Courier §12 token bucket per stream: a stream's bucket is shared by every token, other
    streams are unaffected."""
    other = store.create_workspace("worker", parent=world.boss).id
    app = create_app(store, stream_rate=0.01, stream_burst=1)
    _, second = tokens.create("second", ["streams:*:enqueue", "senders:*:send"])
    with Served(app) as served, httpx.Client(base_url=served.http, timeout=WAIT,
                                             trust_env=False) as c:
        assert enqueue(c, admin, world.inbox, courier(world.boss)).status_code == 200
        assert_error(enqueue(c, second, world.inbox, courier(world.boss)), 429)
        assert enqueue(c, second, f"agents/{other}/inbox",
                       courier(world.boss)).status_code == 200


def test_localhost_mode_serves_requests_without_token(store: EnvelopeStore, world: World,
                                                      tokens: TokenStore) -> None:
    """Courier §7.2 "If absent, allow localhost": with require_tokens=False a loopback
    client needs no token; a token that is presented is still checked. (Also: a body over
    max_body_bytes is 413.)"""
    app = create_app(store, require_tokens=False, max_body_bytes=2000)
    with Served(app) as served, httpx.Client(base_url=served.http, timeout=WAIT,
                                             trust_env=False) as c:
        body = {"to": world.inbox, "envelope": courier(world.boss)}
        assert c.post("/v1/enqueue", json=body).status_code == 200
        big = {"to": world.inbox, "envelope": courier(world.boss, payload={"x": "y" * 3000})}
        assert_error(c.post("/v1/enqueue", json=big), 413)
        assert_error(c.post("/v1/enqueue", json=body, headers=auth("apgw_unknown_token")), 401)
        _, views_only = tokens.create("views-only", ["views:*:read"])
        assert_error(c.post("/v1/enqueue", json=body, headers=auth(views_only)), 403)


def test_localhost_mode_is_one_rate_limit_bucket_for_every_loopback_address(
        store: EnvelopeStore, world: World) -> None:
    """Courier §12 token bucket per token: in localhost mode (--no-auth) the anonymous caller
    is one caller, whatever loopback address it connects from (all of 127.0.0.0/8 is this
    host), so it has one bucket; otherwise each new source address would bring a full one."""
    app = create_app(store, require_tokens=False, token_rate=0.01, token_burst=2)
    with Served(app) as served:
        codes = []
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.1"):
            transport = httpx.HTTPTransport(local_address=source)
            with httpx.Client(base_url=served.http, timeout=WAIT, trust_env=False,
                              transport=transport) as c:
                codes.append(c.get("/v1/stats", params={"stream": world.inbox}).status_code)
    assert codes == [200, 200, 429, 429]


def test_store_failures_do_not_leak(world: World) -> None:
    """Courier §11 / house rule: a store that cannot be reached is a 503 with a generic
    message (HTTP) or a 503 error frame closing with 4503 (WS); no database text leaks."""
    with EnvelopeStore(UNREACHABLE) as broken, Served(
            create_app(broken, require_tokens=False, listen_timeout=0.5)) as served:
        with httpx.Client(base_url=served.http, timeout=WAIT, trust_env=False) as c:
            response = c.get("/v1/stats", params={"stream": world.inbox})
            message = assert_error(response, 503)
            assert "nobody" not in response.text and ":1" not in message
            assert_error(c.get("/v1/stats", headers=auth("apgw_" + "y" * 43)), 503)
        with subscribe(served, None, world.inbox) as ws:
            assert recv(ws)["error"] == {"code": 503, "message": message}
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=WAIT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4503


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.8.9.10")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.org")
    assert not is_loopback(None)


# -- the CLI --------------------------------------------------------------------------------


def test_cli_token_create_list_revoke(module_dsn: str, tokens: TokenStore,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Tokens "managed by CLI": create prints the secret once, list never shows it, revoke
    makes it unusable; bad input exits 2 with one line."""
    code = cli_main(["--dsn", module_dsn, "token", "create", "--name", "cli-made",
                     "--scope", "streams:*:enqueue", "--scope", "views:*:read",
                     "--rate", "5", "--burst", "10"])
    assert code == 0
    created = json.loads(capsys.readouterr().out)
    secret = created["secret"]
    assert created["scopes"] == ["streams:*:enqueue", "views:*:read"]
    assert created["rate"] == 5 and created["burst"] == 10
    assert tokens.authenticate(secret) is not None

    assert cli_main(["--dsn", module_dsn, "token", "list"]) == 0
    listing = capsys.readouterr().out
    assert created["id"] in listing and secret not in listing
    assert cli_main(["--dsn", module_dsn, "token", "list", "--json"]) == 0
    listed = {t["id"]: t for t in json.loads(capsys.readouterr().out)}
    assert "secret" not in listed[created["id"]]

    assert cli_main(["--dsn", module_dsn, "token", "revoke", created["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["revoked_at"] is not None
    assert tokens.authenticate(secret) is None

    assert cli_main(["--dsn", module_dsn, "token", "revoke", "tok_000000000000"]) == 2
    assert cli_main(["--dsn", module_dsn, "token", "create", "--name", "x",
                     "--scope", "streams:*:fly"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_gateway_serves_standalone(module_dsn: str) -> None:
    """The issue: "It runs standalone (`agentpost gateway`) with uvicorn": the command serves
    the API (here in the localhost mode, --no-auth) until it is interrupted."""
    port = _free_port()
    script = Path(sys.executable).parent / "agentpost"
    proc = subprocess.Popen([str(script), "--dsn", module_dsn, "gateway", "--port", str(port),
                             "--no-auth", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                          timeout=WAIT) as c:
            while True:
                assert proc.poll() is None, proc.communicate()[1]
                try:
                    response = c.get("/v1/snapshot", params={"view": "latestPerAgent"})
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "agentpost gateway did not start"
                    time.sleep(0.2)
        assert response.status_code == 200 and "snapshot" in response.json()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err


def test_cli_gateway_refuses_an_unmigrated_database(empty_dsn: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`agentpost gateway` checks for its token table before serving: exit 3, one line."""
    assert cli_main(["--dsn", empty_dsn, "gateway", "--port", str(_free_port())]) == 3
    assert "agentpost migrate" in capsys.readouterr().err
