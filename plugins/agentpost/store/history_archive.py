"""The commands' and sagas' months (sql/0090, 0092): which leave with the trail's months,
their own chains with them, and what of a row the archive keeps (`month_rows` copies,
checks and prunes the rows).

Each command and saga has its own chain (`command:<id>`, `saga:<id>`), which names its row.
A prune lets a row go only with its chain, whole: otherwise the chain's head would stay in
`trail_kept` naming a row that is gone. So `choose`, beside the agents and before the trail's
months are touched, plans the chains that leave (`trail_pruned_chains`, prune NULL):
- a saga completed or compensated whose row is in the months dropped and whose chain has
  no entry outside them; its steps leave with it (they live in its partition);
- a command in a terminal state, on the same terms, that nothing staying refers to: no
  command that stays targets it (a recovery), and no step of a saga that stays runs it
  (`command_key`) or names it as its compensation. Dropping a referrer first can free its
  target, so this is repeated until nothing changes.
The trail's prune then keeps no entry of those chains (`trail_partitions.KEEP`), and the
transaction that drops its months stamps the plan with the prune's id and signs it: a
`chains_pruned` entry with the count and keyed sum of (chain, last seq, last hash). From
then on a first entry on such a chain is refused (sql/0092), so a chain that left never
starts again; a run since a checkpoint that anchors one accepts it as gone by that list
(`store.anchor`). The rows leave last, with their months: a row stays unless its chain is
in the list with a prune.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg2

from agentpost.protocol import named_rows as nr
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.commands import TERMINAL
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.row_digest import MODULUS, RowDigest, row_key
from agentpost.protocol.trail import key_pads
from agentpost.store.month_rows import Rows

__all__ = ["CHAINS_PRUNED", "COMMANDS", "SAGAS", "SAGA_STEPS", "chains_digest", "choose",
           "pruned_chains", "seal", "stamp"]

#: the system chain's record of the chains a prune dropped whole
CHAINS_PRUNED = "chains_pruned"
#: saga states after which nothing runs
SAGAS_OVER = ("completed", "compensated")


def _listed(chain: str, stamped: bool) -> str:
    """The condition that `chain` (an expression) is in trail_pruned_chains: stamped by a
    prune's drop, or only planned or stamped (what `month_rows.check` compares)."""
    return (f"EXISTS (SELECT 1 FROM agentpost.trail_pruned_chains p WHERE p.chain = {chain}"
            + (" AND p.prune IS NOT NULL)" if stamped else ")"))


def _rows(table: str, kind: str, chain: str, columns: tuple[tuple[str, str], ...],
          select: str, counted: str, **keyed: str) -> Rows:
    """A table whose rows stay unless `chain` (of row x) is listed as pruned."""
    key = keyed.get("key", "x.id")
    rule = ("INSERT INTO {keep} SELECT " + key + f" FROM agentpost.{table} x WHERE {{old}}"
            " AND NOT {listed} ON CONFLICT DO NOTHING")
    return Rows(table=table, kind=kind, columns=columns, select=select,
                keep=(rule.replace("{listed}", _listed(chain, True)),),
                keep_check=(rule.replace("{listed}", _listed(chain, False)),),
                again=(), counted=counted, **keyed)


COMMANDS = _rows(
    "commands", nr.COMMAND, "'command:' || x.id",
    (("id", "string"), ("state", "string"), ("row", "string")),
    "SELECT x.id, x.state, (to_jsonb(x) - 'part_day')::text FROM agentpost.commands x",
    "commands")
SAGAS = _rows(
    "sagas", nr.SAGA, "'saga:' || x.id",
    (("id", "string"), ("state", "string"), ("row", "string")),
    "SELECT x.id, x.state, (to_jsonb(x) - 'part_day')::text FROM agentpost.sagas x", "sagas")
#: a step's key: its saga and name (a unit separator between, which no id holds)
_STEP_KEY = "(x.saga_id || chr(31) || x.name)"
SAGA_STEPS = _rows(
    "saga_steps", nr.SAGA_STEP, "'saga:' || x.saga_id",
    (("id", "string"), ("saga_id", "string"), ("name", "string"), ("row", "string")),
    f"SELECT {_STEP_KEY}, x.saga_id, x.name, (to_jsonb(x) - 'part_day')::text"
    " FROM agentpost.saga_steps x", "saga_steps", key=_STEP_KEY,
    digest_key=("convert_to(x.saga_id, 'UTF8') || '\\x00'::bytea"
                " || convert_to(x.name, 'UTF8')"))

#: a row of `table` in the months dropped whose own chain has no entry in the trail's
#: months that stay (one probe of the chain's key per trail partition)
_OLD_ALONE = ("x.part_day >= '1900-01-01' AND x.part_day < %(cut)s"
              " AND x.tableoid = ANY (%({table})s::oid[]) AND NOT EXISTS (SELECT 1"
              " FROM agentpost.trail t WHERE t.chain = {chain}"
              " AND t.tableoid <> ALL (%(trail)s::oid[]))")
_CHOOSE = (
    "CREATE TEMP TABLE agentpost_gone_sagas (id text PRIMARY KEY) ON COMMIT DROP",
    "CREATE TEMP TABLE agentpost_gone_commands (id text PRIMARY KEY) ON COMMIT DROP",
    "INSERT INTO agentpost_gone_sagas SELECT x.id FROM agentpost.sagas x"
    " WHERE x.state = ANY (%(over)s) AND "
    + _OLD_ALONE.format(table="sagas", chain="'saga:' || x.id"),
    "INSERT INTO agentpost_gone_commands SELECT x.id FROM agentpost.commands x"
    " WHERE x.state = ANY (%(terminal)s) AND "
    + _OLD_ALONE.format(table="commands", chain="'command:' || x.id"),
    # the commands the steps of sagas that stay run or compensate with
    "DELETE FROM agentpost_gone_commands g USING agentpost.commands c, agentpost.saga_steps st"
    " WHERE c.id = g.id AND st.workspace = c.workspace AND st.command_key = c.idempotency_key"
    " AND NOT EXISTS (SELECT 1 FROM agentpost_gone_sagas s WHERE s.id = st.saga_id)",
    "DELETE FROM agentpost_gone_commands g USING agentpost.saga_steps st"
    " WHERE st.compensation_id = g.id"
    " AND NOT EXISTS (SELECT 1 FROM agentpost_gone_sagas s WHERE s.id = st.saga_id)",
)
#: the commands that a command staying targets (run until it removes none)
_TARGETED = ("DELETE FROM agentpost_gone_commands g USING agentpost.commands r"
             " WHERE r.target_command_id = g.id"
             " AND NOT EXISTS (SELECT 1 FROM agentpost_gone_commands x WHERE x.id = r.id)")
#: the plan: each chain that leaves, with its last entry (all of its entries are in the
#: trail's months dropped)
_PLAN = ("INSERT INTO agentpost.trail_pruned_chains (chain, seq, hash)"
         " SELECT DISTINCT ON (t.chain) t.chain, t.chain_seq, t.hash"
         " FROM (SELECT 'saga:' || id AS chain FROM agentpost_gone_sagas"
         "       UNION ALL SELECT 'command:' || id FROM agentpost_gone_commands) g"
         " JOIN agentpost.trail t ON t.chain = g.chain"
         " ORDER BY t.chain, t.chain_seq DESC")


def choose(cur: Any, params: dict[str, Any]) -> int:
    """Plan the chains that leave (the module docstring) in the caller's transaction,
    replacing a plan a prune cut short left; how many. `params` holds the cut and the oids
    of the months dropped: `trail`, `sagas`, `commands`."""
    cur.execute("DELETE FROM agentpost.trail_pruned_chains WHERE prune IS NULL")
    params = {**params, "over": list(SAGAS_OVER), "terminal": sorted(s.value for s in TERMINAL)}
    for statement in _CHOOSE:
        cur.execute(statement, params)
    while True:
        cur.execute(_TARGETED)
        if not cur.rowcount:
            break
    cur.execute(_PLAN)
    return cur.rowcount


#: a chain's entry in the digest: its name, its last seq and hash (a NUL between the name
#: and the seq, which no chain name holds)
_CHAIN_KEY = ("convert_to(p.chain, 'UTF8') || '\\x00'::bytea || convert_to(p.seq::text, 'UTF8')"
              " || p.hash")
_CHAINS_DIGEST = ("SELECT count(*), coalesce(sum(('x' || encode(substr(sha256(%(opad)s"
                  f" || sha256(%(ipad)s || {_CHAIN_KEY})), 1, 8), 'hex'))::bit(64)::bigint), 0)"
                  " FROM agentpost.trail_pruned_chains p WHERE p.prune = %(prune)s")


def stamp(cur: Any, prune: int) -> None:
    """Stamp the plan with `prune`'s id, in the transaction that drops the trail's months."""
    cur.execute("UPDATE agentpost.trail_pruned_chains SET prune = %s WHERE prune IS NULL",
                (prune,))


def chains_digest(cur: Any, key: bytes, prune: int) -> RowDigest:
    """The count and keyed sum of the chains `prune` dropped, as listed now."""
    ipad, opad = key_pads(row_key(key))
    cur.execute(_CHAINS_DIGEST, {"ipad": psycopg2.Binary(ipad), "opad": psycopg2.Binary(opad),
                                 "prune": prune})
    count, total = cur.fetchone()
    return RowDigest(count, int(total) % MODULUS)


def pruned_chains(cur: Any, chains: list[str]) -> dict[str, tuple[int, bytes, int]]:
    """Of `chains`, those a prune dropped: chain -> (last seq, last hash, prune id)."""
    cur.execute("SELECT chain, seq, hash, prune FROM agentpost.trail_pruned_chains"
                " WHERE chain = ANY (%s) AND prune IS NOT NULL", (chains,))
    return {c: (seq, bytes(h), prune) for c, seq, h, prune in cur.fetchall()}


def seal(cur: Any, key: bytes, cut: Any, prune: int, horizon: int) -> int:
    """Under the trail's ACCESS EXCLUSIVE lock, before its months are dropped (the caller
    holds the system chain's lock too): refuse if a planned chain took an entry since
    `horizon` (a recovery of a command about to leave: its chain goes on, so it stays; a
    second run plans without it), else stamp the plan with `prune` and sign it in a
    `chains_pruned` entry. How many chains leave."""
    cur.execute("SELECT t.chain FROM agentpost.trail t JOIN agentpost.trail_pruned_chains p"
                " ON p.chain = t.chain AND p.prune IS NULL WHERE t.id > %s LIMIT 1",
                (horizon,))
    moved = cur.fetchone()
    if moved is not None:
        raise InvalidInput(f"{moved[0]} took an entry while the prune ran: nothing dropped; "
                           "run the prune again")
    stamp(cur, prune)
    digest = chains_digest(cur, key, prune)
    if digest.count:
        body = {"cut": str(cut), "prune": prune, **digest.to_json()}
        cur.execute("SELECT agentpost._trail_write(ARRAY[%s], ARRAY[%s], ARRAY[NULL]::text[],"
                    " ARRAY[%s::jsonb], true)", (SYSTEM_CHAIN, CHAINS_PRUNED, json.dumps(body)))
    return digest.count
