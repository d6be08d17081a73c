"""The envelopes' months (sql/0088): which rows stay when the trail's months leave, and
what of a row the archive keeps (`month_rows` copies, checks and prunes them).

A row stays while it is open (validated, or acknowledged and not consumed: a lease or a
redelivery may still read and change it) or while an entry that stays names it (its
`envelope_id`): the row checks read the rows the entries name. Everything else in the months
leaves, its copy in the archive.
"""

from __future__ import annotations

from agentpost.protocol import named_rows as nr
from agentpost.store.month_rows import Rows

__all__ = ["ENVELOPES"]

_OPEN = ("x.status = 'acknowledged' AND x.consumed_at IS NULL", "x.status = 'validated'")
_INTO = "INSERT INTO {keep} SELECT x.id FROM agentpost.envelopes x WHERE {old} AND "
#: the rows still open, through the partial indexes that hold only those (envelopes_ready,
#: envelopes_pending: their predicates, word for word); then those an entry names
_KEEP = (*(_INTO + f"{o} ON CONFLICT DO NOTHING" for o in _OPEN),
         _INTO + "x.id IN (SELECT t.envelope_id FROM agentpost.trail t"
                 " WHERE t.envelope_id IS NOT NULL AND {entries}) ON CONFLICT DO NOTHING")

ENVELOPES = Rows(
    table="envelopes", kind=nr.ENVELOPE,
    # the columns the Spark audit reads, the row as signed (`now`), the row as stored
    columns=(("id", "string"), ("seq", "int64"), ("status", "string"), ("sender", "string"),
             ("recipient", "string"), ("delivered", "bool_"), ("consumed", "bool_"),
             ("created_at", "timestamp"), ("now", "string"), ("row", "string")),
    select=("SELECT x.id, x.seq, x.status, x.sender, x.recipient, x.delivered_at IS NOT NULL,"
            " x.consumed_at IS NOT NULL, x.created_at, agentpost._envelope_row(x, true)::text,"
            " (to_jsonb(x) - 'part_day')::text FROM agentpost.envelopes x"),
    # step 4 keeps the same rules, over the entries since the horizon: an index range
    keep=_KEEP, again=_KEEP, counted="envelopes")
