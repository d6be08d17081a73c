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
    """One envelope consumed and one waiting, both before the cut; the month pruned."""
    st.create_workspace("worker", parent=BOSS, workspace_id="ar-w")
    done = st.send(BOSS, "ar-w", "directive", "finished long ago").envelope_id
    [lease] = st.lease("ar-w", 1)
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
    return {"done": done, "waiting": waiting, "dir": str(directory)}


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


def test_an_envelope_open_at_the_cut_keeps_its_entries_in_postgres(web, pruned) -> None:
    page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['waiting']}")
    assert page.status_code == 200 and 'id="archived"' not in page.text
    assert set(verdicts(page.text).values()) == {"yes"}
    assert "The row matches what its entries signed." in page.text


def test_an_archived_entry_edited_in_the_archive_shows_as_not_verifying(
        web, pruned, module_dsn: str, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(pruned["dir"], copy)
    for path in copy.rglob("*.parquet"):
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
        page = web.client("viewer").get(f"/agentpost/envelopes/{pruned['done']}")
        assert page.status_code == 200 and "cannot reach the archive" in page.text
        # an entry kept in Postgres whose predecessor went: checked alone, and says so
        kept = web.client("viewer").get(f"/agentpost/envelopes/{pruned['waiting']}")
        assert set(verdicts(kept.text).values()) == {"yes"}
        assert "that link is not checked here" in kept.text
    finally:
        rows(conn, "UPDATE agentpost.trail_prunes SET archive = %s", (pruned["dir"],))
        conn.close()
