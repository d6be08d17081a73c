"""The commands and sagas leave with the trail's months, their own chains whole with them
(issue 26; `store/history_archive.py`): what is over and nothing staying refers to goes to
the archive and out of Postgres; everything else stays and goes on; a run since a checkpoint
that anchors a chain that left accepts it by the prune's signed list, and only by it.

Time is faked as in test_trail_prune: `age` moves what was written so far into a month long
past, by its partition key alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.store import EnvelopeStore, history_archive
from agentpost.store.commands import CommandLedger
from agentpost.store.sagas import SagaRunner
from agentpost.store.trail_archive import archive, prune
from agentpost.store.trail_export import MANIFEST
from dbtools import rows
from test_trail_prune import age, month_after, months, old_month


def _runner(ledger: CommandLedger) -> SagaRunner:
    return SagaRunner(ledger, {"cancel": lambda args: None})


@pytest.fixture
def history(store: EnvelopeStore, pg: Any) -> dict[str, str]:
    """Commands and sagas, four months old but for what each is about:
    - done: executed; target: compensated by comp, executed; trip: a saga completed, its
      step's command executed. All of these may go.
    - kept: executed, but a compensation submitted this month targets it; open: submitted,
      not run; open-trip: a saga still running, its step's command executed."""
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="a")
    made: dict[str, str] = {}
    with CommandLedger(store) as ledger:
        run = ledger.run
        for name in ("done", "target", "kept"):
            made[name] = run("a", name, lambda: {"ok": 1}, action="book", mutating=True,
                             auto_confirm="low-risk").command_id
        made["comp"] = ledger.compensate(made["target"], "comp", lambda: {"ok": 2},
                                         auto_confirm="low-risk").command_id
        made["open"] = ledger.submit("a", "open", action="book", mutating=True).command_id
        trip = _runner(ledger).begin("a", "trip")
        trip.step("flight", lambda: {"seat": 1}, action="book", auto_confirm="policy")
        made["trip"] = trip.complete().saga_id
        made["trip step"] = ledger.find("a", f"saga:{made['trip']}/flight").command_id
        running = _runner(ledger).begin("a", "open-trip")
        running.step("train", lambda: {"seat": 2}, action="book", auto_confirm="policy")
        made["open-trip"] = running.view().saga_id
        age(pg, old_month())
        made["kept comp"] = ledger.recover(made["kept"], "compensate", "kept-comp",
                                           auto_confirm="low-risk").command_id
    return made


GONE = ("done", "target", "comp", "trip step")
STAYING = ("kept", "kept comp", "open")


def _commands(pg: Any) -> set[str]:
    return {r[0] for r in rows(pg, "SELECT id FROM agentpost.commands")}


def test_what_is_over_leaves_with_its_chain_and_the_rest_goes_on(
        history: dict[str, str], store: EnvelopeStore, pg: Any, tmp_path: Path) -> None:
    cut = month_after(old_month())
    before = _commands(pg)
    done = archive(store, str(tmp_path), cut)
    assert done.partitions[1:] == months(old_month())
    assert done.commands == len(before) - 1 and done.sagas == 2 and done.saga_steps == 2
    manifest = json.loads((tmp_path / MANIFEST).read_text())["cuts"][0]
    copied = pq.read_table(str(tmp_path / manifest["commands"])).to_pylist()
    assert {r["id"] for r in copied} == before - {history["kept comp"]}

    pruned = prune(store, str(tmp_path), cut)
    gone = {history[n] for n in GONE}
    assert (pruned.commands, pruned.sagas, pruned.saga_steps) == (len(gone), 1, 1)
    assert pruned.chains == len(gone) + 1
    assert _commands(pg) == before - gone
    assert {history[n] for n in STAYING} <= _commands(pg)
    assert [r[0] for r in rows(pg, "SELECT id FROM agentpost.sagas")] == [history["open-trip"]]
    listed = {r[0] for r in rows(pg, "SELECT chain FROM agentpost.trail_pruned_chains"
                                     " WHERE prune IS NOT NULL")}
    assert listed == {f"command:{c}" for c in gone} | {f"saga:{history['trip']}"}
    # none of their entries stayed: the chains left whole
    assert rows(pg, "SELECT count(*) FROM agentpost.trail t JOIN"
                    " agentpost.trail_pruned_chains p ON p.chain = t.chain") == [(0,)]
    (body,) = rows(pg, "SELECT record::jsonb -> 'body' FROM agentpost.trail WHERE chain ="
                       " 'system' AND event = 'chains_pruned'")[0]
    assert body["count"] == len(listed)
    # the run since the cut's checkpoint, which anchors every chain that left, and the run
    # since the prune: both verify, every row accounted for
    for since in (tmp_path / done.checkpoint, None):
        result = store.verify_trail(since=since)
        assert result.ok, result.failure
        assert result.rows_unaccounted == ()
    with CommandLedger(store) as ledger:
        with pytest.raises(NotFound):
            ledger.view(history["done"])
        # what stayed goes on: the kept command's compensation runs, the saga completes
        ledger.execute(history["kept comp"], lambda: {"ok": 3})
        assert ledger.view(history["kept"]).state.value == "compensated"
        saga = _runner(ledger).begin("a", "open-trip")
        saga.step("train", lambda: {"seat": 2}, action="book", auto_confirm="policy")
        assert saga.complete().state.value == "completed"
    # a chain that left never starts again
    with pytest.raises(Conflict, match="was pruned"):
        store.db.scalar("SELECT agentpost._trail_one(%s, 'command_note', NULL, '{}'::jsonb)",
                        (f"command:{history['done']}",))
    assert store.verify_trail(since=tmp_path / done.checkpoint).ok


def test_an_edited_list_of_chains_that_left_vouches_for_nothing(
        history: dict[str, str], store: EnvelopeStore, pg: Any, tmp_path: Path) -> None:
    cut = month_after(old_month())
    done = archive(store, str(tmp_path), cut)
    prune(store, str(tmp_path), cut)
    chain = f"command:{history['done']}"
    rows(pg, "DELETE FROM agentpost.trail_pruned_chains WHERE chain = %s", (chain,))
    result = store.verify_trail(since=tmp_path / done.checkpoint)
    # the list no longer matches its signed entry: none of the five chains that left is
    # accepted as gone, and the list is reported
    assert not result.ok and result.failures == 1 + len(GONE) + 1
    assert "the list was edited" in result.failure
    assert chain in {m.chain for m in result.anchor_mismatches}
    assert len(result.anchor_mismatches) == len(GONE) + 1
    assert all("is gone" in m.problem for m in result.anchor_mismatches)


def test_a_chain_planned_to_leave_that_takes_an_entry_meanwhile_stays(
        history: dict[str, str], store: EnvelopeStore, pg: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A command about to leave is compensated after the prune planned its chain: the drop
    is refused, nothing leaves; run again, that command and its chain stay, the rest
    leave."""
    cut = month_after(old_month())
    done = archive(store, str(tmp_path), cut)
    real_choose = history_archive.choose

    def choose_then_retry(cur: Any, params: dict) -> int:
        planned = real_choose(cur, params)
        with CommandLedger(store) as ledger:
            ledger.recover(history["done"], "compensate", "late-comp")
        return planned

    monkeypatch.setattr(history_archive, "choose", choose_then_retry)
    with pytest.raises(InvalidInput, match=f"command:{history['done']} took an entry while"
                                           " the prune ran: nothing dropped"):
        prune(store, str(tmp_path), cut)
    monkeypatch.setattr(history_archive, "choose", real_choose)
    assert rows(pg, "SELECT count(*) FROM agentpost.trail_pruned_chains"
                    " WHERE prune IS NOT NULL") == [(0,)]
    assert store.verify_trail().ok
    again = prune(store, str(tmp_path), cut)
    assert again.commands == len(GONE) - 1 and history["done"] in _commands(pg)
    result = store.verify_trail(since=tmp_path / done.checkpoint)
    assert result.ok, result.failure
