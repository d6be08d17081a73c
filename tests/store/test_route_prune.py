"""The routes' months leave with the trail's (issue 26; `store/route_archive.py`): a family
whose members have all ended, all in the months dropped and named by no entry that stays,
goes to the archive and out of Postgres; every other family stays whole, and goes on.

Time is faked as in test_trail_prune: `age` moves what was written so far into a month long
past, by its partition key alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.protocol.routes import HAPPY_END, RouteStatus
from agentpost.store import EnvelopeStore
from agentpost.store.routes import Hop, RouteStore
from agentpost.store.trail_archive import archive, prune
from agentpost.store.trail_export import MANIFEST
from dbtools import rows
from test_trail_prune import age, count, exists, month_after, old_month, partition

ACTORS = ["a", "b"]


def _fan_out(rs: RouteStore, root: str) -> dict[str, Hop]:
    """Start `root`; at a it returns two payloads: `root` and `root`-1 wait at b."""
    rs.start({"id": root, "route": {"actors": ACTORS}, "payload": {}})
    (hop,) = rs.receive("a")
    rs.complete("a", hop.lease, hop.envelope, [{"n": 0}, {"n": 1}])
    return {h.envelope.id: h for h in rs.receive("b", max=10)}


def _end(rs: RouteStore, hops: list[Hop]) -> None:
    """Complete `hops` at b and take their envelopes out of happy-end."""
    for hop in hops:
        rs.complete("b", hop.lease, hop.envelope, {"b": True})
    rs.finish_many(rs.receive(HAPPY_END, max=10))


def _ended_family(rs: RouteStore, root: str) -> None:
    _end(rs, list(_fan_out(rs, root).values()))
    assert rs.family(root).status is RouteStatus.SUCCEEDED


@pytest.fixture
def families(store: EnvelopeStore, pg: Any) -> tuple[RouteStore, Hop]:
    """Four families of two, four months old but for what each test is about:
    - `done`: both members ended; it may go;
    - `live`: `live`-1 ended, `live` still waits at b (its hop is returned);
    - `recent`: both ended, but `recent`-1's row is in this month;
    - `named`: both ended, but an entry naming `named`-1 is in this month."""
    rs = RouteStore(store)
    rs.setup(ACTORS)
    _ended_family(rs, "done")
    live = _fan_out(rs, "live")
    _end(rs, [live["live-1"]])
    _ended_family(rs, "recent")
    _ended_family(rs, "named")
    month = old_month()
    age(pg, month)
    rows(pg, "UPDATE agentpost.routes SET part_day = current_date WHERE id = 'recent-1'")
    rows(pg, "UPDATE agentpost.trail SET part_day = current_date WHERE id = (SELECT max(id)"
             " FROM agentpost.trail WHERE event = 'route_progress'"
             " AND record::jsonb -> 'body' ->> 'id' = 'named-1')")
    return rs, live["live"]


def _ids(conn: Any, table: str) -> set[str]:
    return {r[0] for r in rows(conn, f"SELECT id FROM agentpost.{table}")}


def test_an_ended_family_leaves_and_every_other_stays_whole(
        families: tuple, pg: Any, tmp_path: Path) -> None:
    rs, waiting = families
    store = rs.store
    cut, month = month_after(old_month()), partition(old_month(), "routes")
    assert _ids(pg, month) == {"done", "done-1", "live", "live-1", "recent", "named",
                               "named-1"}
    done = archive(store, str(tmp_path), cut)
    assert month in done.partitions and done.routes == 7
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    copied = pq.read_table(str(tmp_path / manifest["cuts"][0]["routes"])).to_pylist()
    assert {r["id"] for r in copied} == _ids(pg, month)
    stored = {r["id"]: r for r in copied}["done-1"]
    assert json.loads(stored["row"])["end_actor"] == HAPPY_END == stored["end_actor"]

    pruned = prune(store, str(tmp_path), cut)
    assert (pruned.routes, pruned.routes_kept) == (2, 5)
    assert month in pruned.partitions and not exists(pg, month)
    assert _ids(pg, "routes_kept") == {"live", "live-1", "recent", "named", "named-1"}
    assert _ids(pg, "routes") == _ids(pg, "routes_kept") | {"recent-1"}
    with pytest.raises(NotFound):
        rs.get("done")
    (body,) = rows(pg, "SELECT record::jsonb -> 'body' FROM agentpost.trail WHERE chain ="
                       " 'system' AND event = 'rows_pruned' AND record::jsonb -> 'body'"
                       " ->> 'kind' = 'route'")[0]
    assert body["count"] == 2 and body["partitions"] == [month]
    assert rows(pg, "SELECT routes FROM agentpost.trail_prunes") == [(2,)]
    # the trail verifies, since the prune's checkpoint and since the cut's, to the row
    result = store.verify_trail()
    assert result.ok, result.failure
    assert result.rows_unaccounted == ()
    assert store.verify_trail(since=tmp_path / done.checkpoint).ok
    # the family still running goes on to its end, whole
    _end(rs, [waiting])
    family = rs.family("live")
    assert family.status is RouteStatus.SUCCEEDED and len(family.members) == 2
    assert rs.family("recent").status is RouteStatus.SUCCEEDED
    assert store.verify_trail().ok


def test_without_a_routes_copy_as_stored_nothing_is_dropped(
        families: tuple, pg: Any, tmp_path: Path) -> None:
    """An archive whose copy of the routes lacks a row that would leave, or holds it
    changed, is refused before the trail loses a month."""
    rs, _ = families
    cut = month_after(old_month())
    archive(rs.store, str(tmp_path), cut)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    path = tmp_path / manifest["cuts"][0]["routes"] / "part-00000.parquet"
    table = pq.read_table(str(path))
    edited = [dict(r, row=r["row"].replace('"happy-end"', '"error-end"'))
              if r["id"] == "done-1" else r for r in table.to_pylist()]
    for copy in ([r for r in table.to_pylist() if r["id"] != "done"], edited):
        pq.write_table(table.from_pylist(copy, schema=table.schema), str(path))
        with pytest.raises(InvalidInput, match="1 routes rows of the months to drop are not"
                                               " in the archive as stored: nothing pruned"):
            prune(rs.store, str(tmp_path), cut)
        assert exists(pg, partition(old_month())) and exists(pg, partition(old_month(),
                                                                          "routes"))
        assert count(pg, "routes_kept") == 0
    assert rs.store.verify_trail().ok
