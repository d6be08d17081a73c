"""The routes' months (sql/0090): which rows stay when the trail's months leave, and what
of a row the archive keeps (`month_rows` copies, checks and prunes them).

A route's row is its family's (all routes of one root_id): the page and `family()` read the
members together, and a fan-out writes a child's root_id from its parent's row. So rows
leave a family at a time, and only once the family is over: a family stays whole while any
member has not ended (a member may still hop, fan out or fail), lives in a month that stays,
or is named by a `route_progress` entry that stays (the row checks read the rows the
entries name: by id, and through a member's entry, by its root_id).
"""

from __future__ import annotations

from agentpost.protocol import named_rows as nr
from agentpost.store.month_rows import Rows

__all__ = ["ROUTES"]

_INTO = ("INSERT INTO {keep} SELECT x.id FROM agentpost.routes x WHERE {old}"
         " AND x.root_id IN ")
#: the route a `route_progress` entry names (what the index trail_route_rows holds)
_NAMED = "(t.record::jsonb -> 'body' ->> 'id')"
_KEEP = (
    # families with a member not ended, or in a month that stays
    _INTO + "(SELECT m.root_id FROM agentpost.routes m WHERE m.end_actor IS NULL"
            " OR m.tableoid <> ALL (%(oids)s::oid[])) ON CONFLICT DO NOTHING",
    # rows an entry that stays names: a probe of trail_route_rows per row of the months
    "INSERT INTO {keep} SELECT x.id FROM agentpost.routes x WHERE {old} AND EXISTS (SELECT 1"
    f" FROM agentpost.trail t WHERE t.event = 'route_progress' AND {_NAMED} = x.id"
    " AND {entries}) ON CONFLICT DO NOTHING",
    # and their families
    _INTO + "(SELECT m.root_id FROM agentpost.routes m JOIN {keep} k ON k.id = m.id)"
            " ON CONFLICT DO NOTHING",
)
#: under the lock, the families of the routes named since the horizon (an id range of the
#: trail): a family over cannot start again, and a new member names its root
_AGAIN = (_INTO + "(SELECT m.root_id FROM agentpost.trail t JOIN agentpost.routes m"
                  f" ON m.id = {_NAMED} WHERE t.id > %(horizon)s"
                  " AND t.event = 'route_progress') ON CONFLICT DO NOTHING",)

ROUTES = Rows(
    table="routes", kind=nr.ROUTE,
    columns=(("id", "string"), ("envelope_id", "string"), ("current", "int32"),
             ("end_actor", "string"), ("phase", "string"), ("row", "string")),
    select=("SELECT x.id, x.envelope_id, x.current, x.end_actor, x.phase,"
            " (to_jsonb(x) - 'part_day')::text FROM agentpost.routes x"),
    keep=_KEEP, again=_AGAIN, counted="routes")

