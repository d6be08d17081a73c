"""/agentpost/metrics in Airflow's API app: Prometheus text after real traffic, each number
checked against the store; the label set bounded; the scrape token or an Airflow user, 401
otherwise; the gateway's and the MCP endpoint's responses counted by status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentpost.smcl import CommandLedger
from agentpost.store import EnvelopeStore

BOSS = "m-boss"
WORKERS = ("m-w1", "m-w2", "m-w3")
TOKEN = "scrape-secret-0123456789"


@pytest.fixture(scope="module")
def traffic(st: EnvelopeStore) -> dict[str, Any]:
    """Three inboxes with 3, 2 and 1 envelopes waiting (one of the first leased, one nacked
    back), two rejections, a command, and a verification recorded."""
    for w in WORKERS:
        st.create_workspace("worker", parent=BOSS, workspace_id=w)
    for w, n in zip(WORKERS, (3, 2, 1), strict=True):
        for i in range(n):
            assert st.send(BOSS, w, "directive", f"task {i}").accepted
    (taken,) = st.lease("m-w1", max=1, ttl=300.0)
    (back,) = st.lease("m-w2", max=1, ttl=300.0)
    st.nack(back.token)
    assert st.send("m-w1", "m-w2", "directive", "workers do not direct").reason \
        == "permission_denied"
    assert st.send(BOSS, "m-w1", "no-such-type", "?").reason == "invalid_type"
    with CommandLedger(st) as ledger:
        ledger.submit(BOSS, "k-metrics", action="query", mutating=False)
    st.record_verification(st.verify_trail(), anchor=None, by="test")
    return {"leased": taken.envelope.id}


def scrape(web: Any, *, headers: dict[str, str] | None = None, role: str | None = None
           ) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = web.client(role).get("/agentpost/metrics", headers=headers or {})
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def one(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AGENTPOST_METRICS_TOKEN", TOKEN)
    yield TOKEN


def test_the_numbers_are_the_store_s(web: Any, st: EnvelopeStore,
                                     traffic: dict[str, Any]) -> None:
    got = scrape(web, role="viewer")
    for w in (BOSS, *WORKERS):
        assert one(got, "agentpost_inbox_depth", inbox=w) == len(st.inbox(w))
    assert [one(got, "agentpost_inbox_depth", inbox=w) for w in WORKERS] == [3, 2, 1]
    assert one(got, "agentpost_inbox_in_flight", inbox="m-w1") == 1
    assert one(got, "agentpost_inbox_in_flight", inbox="m-w2") == 0  # nacked back
    assert one(got, "agentpost_in_flight") == 1
    assert one(got, "agentpost_depth") == sum(len(st.inbox(w)) for w in (BOSS, *WORKERS))
    stats = st.stats("m-w2")
    assert one(got, "agentpost_inbox_redeliveries_total", inbox="m-w2") \
        == stats.redeliveries
    assert one(got, "agentpost_inbox_oldest_waiting_seconds", inbox="m-w3") > 0
    assert one(got, "agentpost_rejections_total", reason="permission_denied") == 1
    assert one(got, "agentpost_rejections_total", reason="invalid_type") == 1
    assert one(got, "agentpost_commands", state="canonicalized") == 1
    assert one(got, "agentpost_event_claim_backlog") == 0
    assert 0 <= one(got, "agentpost_trail_verified_age_seconds") < 600
    assert one(got, "agentpost_trail_last_verification_ok") == 1
    assert one(got, "agentpost_inboxes_unnamed") == 0
    # two first leases (m-w1's, and m-w2's nacked back): the window counts both, each bucket
    # from its latency up
    buckets = got["agentpost_delivery_latency_seconds_bucket"]
    assert buckets[(("le", "+Inf"),)] == 2
    counts = [buckets[(("le", le),)] for le in ("0.005", "0.1", "10.0", "300.0", "+Inf")]
    assert counts == sorted(counts)


def test_the_label_set_is_bounded(web: Any, st: EnvelopeStore, traffic: dict[str, Any],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTPOST_METRICS_INBOXES", "1")
    got = scrape(web, role="viewer")
    assert {dict(k)["inbox"] for k in got["agentpost_inbox_depth"]} == {"m-w1", "_others"}
    assert one(got, "agentpost_inbox_depth", inbox="_others") == 3  # 2 + 1 + the boss's 0
    assert one(got, "agentpost_inboxes_unnamed") == 3
    monkeypatch.setenv("AGENTPOST_METRICS_INBOXES", "all")
    named = {dict(k)["inbox"] for k in scrape(web, role="viewer")["agentpost_inbox_depth"]}
    assert {BOSS, *WORKERS} <= named and "_others" not in named
    monkeypatch.setenv("AGENTPOST_METRICS_INBOXES", "lots")
    bad = web.client("viewer").get("/agentpost/metrics")
    assert bad.status_code == 400 and "metrics_inboxes" in bad.text
    assert "Traceback" not in bad.text


def test_the_scrape_token_or_a_user_else_401(web: Any, traffic: dict[str, Any],
                                             token: str) -> None:
    assert "agentpost_depth" in scrape(web, headers={"Authorization": f"Bearer {token}"})
    for headers in ({}, {"Authorization": "Bearer not-the-token"},
                    {"Authorization": f"Bearer {token}x"}):
        refused = web.client(None).get("/agentpost/metrics", headers=headers)
        assert refused.status_code == 401, (headers, refused.text[:200])
        assert "agentpost_" not in refused.text


def test_gateway_and_mcp_responses_are_counted_by_status(web: Any,
                                                         traffic: dict[str, Any]) -> None:
    before = scrape(web, role="viewer").get("agentpost_http_requests_total", {})
    key = (("status", "401"), ("surface", "gateway"))
    for _ in range(2):
        assert web.client(None).get("/agentpost/v1/stats").status_code == 401
    assert web.client(None).post("/agentpost/mcp", json={}).status_code == 401
    after = scrape(web, role="viewer")["agentpost_http_requests_total"]
    assert after[key] - before.get(key, 0) == 2
    mcp = (("status", "401"), ("surface", "mcp"))
    assert after[mcp] - before.get(mcp, 0) == 1


def test_the_grafana_dashboard_reads_only_what_we_serve(web: Any,
                                                        traffic: dict[str, Any]) -> None:
    """docker/grafana/dashboards/agentpost.json loads, its panels use the provisioned
    Prometheus data source, and every metric its queries name is one the endpoint serves."""
    import json
    import re
    from pathlib import Path

    import yaml

    docker = Path(__file__).resolve().parents[2] / "docker"
    dashboard = json.loads((docker / "grafana" / "dashboards" / "agentpost.json").read_text())
    source = yaml.safe_load((docker / "grafana" / "provisioning" / "datasources"
                             / "prometheus.yaml").read_text())["datasources"][0]
    web.client(None).get("/agentpost/v1/stats")  # a gateway response, so its count is served
    served = set(scrape(web, role="viewer"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert dashboard["uid"] == "agentpost" and len(exprs) >= 10
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {source["uid"]}
    named = {m for e in exprs for m in re.findall(r"\bagentpost_[a-z_]+", e)}
    assert named and named <= served, sorted(named - served)
