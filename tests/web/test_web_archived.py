"""The envelope page after a prune (issue 26): an envelope whose entries a prune took out of
Postgres says "archived" and shows its entries from the archive, each checked there; an
envelope still open at the cut keeps its entries in Postgres and its row checks."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.trail_archive import archive, prune
from dbtools import connect, rows
from test_trail_prune import age, month_after, old_month
from test_web_envelopes import verdicts

BOSS = "ar-boss"


@pytest.fixture(scope="module")
def pruned(st: EnvelopeStore, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, str]:
    """Two envelopes consumed (the first one's row leaves with the month: nothing that
    stays names it) and one waiting, all before the cut; the month pruned."""
    st.create_workspace("worker", parent=BOSS, workspace_id="ar-w")
    gone = st.send(BOSS, "ar-w", "directive", "gone long ago").envelope_id
    done = st.send(BOSS, "ar-w", "directive", "finished long ago").envelope_id
    for lease in st.lease("ar-w", 2):
        st.ack(lease.token)
    waiting = st.send(BOSS, "ar-w", "directive", "still waiting").envelope_id
    directory = tmp_path_factory.mktemp("archive")
    conn = connect(module_dsn)
    try:
        month = old_month()
        age(conn, month)
        cut = month_after(month)
        archive(st, str(directory), cut)
        prune(st, str(directory), cut)
    finally:
        conn.close()
    return {"gone": gone, "done": done, "waiting": waiting, "dir": str(directory)}


def test_an_archived_envelope_shows_its_entries_from_the_archive(web, st, pruned) -> None:
    page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['done']}")
    assert page.status_code == 200
    assert 'id="archived"' in page.text and pruned["dir"] in page.text
    shown = verdicts(page.text)
    sources = dict(re.findall(r'<tr data-entry="(\d+)"[^>]*data-source="(\w+)"', page.text))
    assert shown and set(shown.values()) == {"yes"}, page.text[-3000:]
    assert "archive" in sources.values()
    events = [e for e, _ in re.findall(r'<li data-event="(\w+)" data-entry="(\d+)">', page.text)]
    assert events[0] == "envelope_created" and "envelope_consumed" in events
    assert 'id="row-problems"' not in page.text  # no false alarm for the entries gone
    api = web.client("viewer").get(f"/agentpost/api/envelopes/{pruned['done']}").json()
    assert api["archived"]["reachable"] and api["all_verified"]


def test_an_envelope_whose_row_was_pruned_is_shown_from_the_archive(web, st, pruned,
                                                                    module_dsn: str) -> None:
    """The row left Postgres with its month: the page shows the archive's copy of it (the
    content included), says so, and checks its entries from the archive."""
    conn = connect(module_dsn)
    try:
        assert rows(conn, "SELECT count(*) FROM agentpost.envelopes WHERE id = %s",
                    (pruned["gone"],))[0][0] == 0
    finally:
        conn.close()
    page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['gone']}")
    assert page.status_code == 200, page.text[-2000:]
    assert 'id="row-archived"' in page.text and "gone long ago" in page.text
    assert set(verdicts(page.text).values()) == {"yes"}
    events = [e for e, _ in re.findall(r'<li data-event="(\w+)" data-entry="(\d+)">', page.text)]
    assert events[0] == "envelope_created" and "envelope_consumed" in events
    api = web.client("viewer").get(f"/agentpost/api/envelopes/{pruned['gone']}").json()
    assert api["envelope"]["payload"]["content"] == "gone long ago" and api["all_verified"]
    assert api["envelope"]["consumed_at"] is not None and api["lease"]["leases"] == 1
    # an id that never was stays unknown
    assert web.client("viewer").get("/agentpost/envelopes/never-was").status_code == 404


def test_an_envelope_open_at_the_cut_keeps_its_entries_in_postgres(web, pruned) -> None:
    page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['waiting']}")
    assert page.status_code == 200 and 'id="archived"' not in page.text
    assert set(verdicts(page.text).values()) == {"yes"}
    assert "The row matches what its entries signed." in page.text


def test_an_archived_entry_edited_in_the_archive_shows_as_not_verifying(
        web, pruned, module_dsn: str, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(pruned["dir"], copy)
    for path in copy.rglob("batch-*/*/*.parquet"):  # the entries (not the envelope rows)
        table = pq.read_table(str(path))
        records = [r.replace('"body"', '"body" ') if json.loads(r)["body"].get("envelope_id")
                   == pruned["done"] else r for r in table.column("record").to_pylist()]
        pq.write_table(table.set_column(table.schema.get_field_index("record"), "record",
                                        pa.array(records, type=pa.string())), str(path))
    conn = connect(module_dsn)
    try:
        rows(conn, "UPDATE agentpost.trail_prunes SET archive = %s", (str(copy),))
        page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['done']}")
        assert "no" in verdicts(page.text).values()
        assert "Some entries do NOT verify" in page.text
    finally:
        rows(conn, "UPDATE agentpost.trail_prunes SET archive = %s", (pruned["dir"],))
        conn.close()


def test_an_unreachable_archive_is_said_so(web, pruned, module_dsn: str) -> None:
    conn = connect(module_dsn)
    try:
        rows(conn, "UPDATE agentpost.trail_prunes SET archive = '/nowhere/archive'")
        # an entry kept in Postgres whose predecessor went: checked alone, and says so
        kept = web.client("viewer").get(f"/agentpost/envelopes/{pruned['waiting']}")
        assert set(verdicts(kept.text).values()) == {"yes"}
        assert "that link is not checked here" in kept.text
        # rows that left with the prune: not found, and the page says where to look
        for envelope in ("gone", "done"):
            page = web.client("viewer").get(f"/agentpost/envelopes/{pruned[envelope]}")
            assert page.status_code == 404 and "/nowhere/archive" in page.text
            assert "cannot reach" in page.text
    finally:
        rows(conn, "UPDATE agentpost.trail_prunes SET archive = %s", (pruned["dir"],))
        conn.close()
