"""Agent names for the pages. The mark space keeps an agent by its id (a UUID) on every
mark; its name comes from two places, the first one exact for any name:

- **recorded**: `agentpost.mark_agents` (sql/0076) holds, per space, the name each agent id
  last wrote under (every write records it, a fleet apply records its agents before they
  write). The pages look up the ids they show, across spaces, the newest name per id.
- **derived**, for marks written before sql/0076 by agents that did not write since: the ids
  the project hands out are derived from names, so the page derives the id of every name the
  store knows of and matches:

  - a fleet's agent: ``uuid5(fleet AGENT_NAMESPACE, "<space>/<name>")`` (fleet/model.py),
  - an operator's agent given by name: ``uuid5(operators AGENT_NAMESPACE, name)``
    (`stable_agent`),
  - a person on the page: ``uuid5(PEOPLE, user)``, named ``human:<user>``,
  - the guard's own agent (``markspace-guard``).

  The names tried are the store's workspace ids (fleets often name agents after their
  workspaces) and the people of the trail's ``human:<user>`` chains. A match is exact (a
  UUIDv5 is a hash of the name). No migration can fill the table from these: Postgres has no
  SHA-1 (uuid5's hash) without an extension.

A recorded name wins over a derived one. An agent that no source names keeps its id. The
names are read on every page (three short index reads), so an agent that just wrote is named
at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from fastapi import Request

from agentpost.fleet.model import AGENT_NAMESPACE as FLEET_NAMESPACE
from agentpost.marks.guard import SYSTEM_AGENT_ID, SYSTEM_AGENT_NAME
from agentpost.store import EnvelopeStore
from agentpost.web.auth import user_name

#: agent ids of people: uuid5 of their user name in this namespace (docs/ui.md)
PEOPLE = uuid5(NAMESPACE_URL, "agentpost:human")
#: how many workspace ids and people are tried at most
MAX_WORKSPACES = 5_000
MAX_PEOPLE = 1_000
#: how many ids one page looks up in the recorded names at most
MAX_IDS = 5_000

_WORKSPACES = "SELECT id FROM agentpost.workspaces ORDER BY id LIMIT %(limit)s"
# the distinct human:<user> chains of the trail: a loose scan of its (chain, chain_seq) index,
# one probe per person
_PEOPLE = """
WITH RECURSIVE people(chain, n) AS (
    SELECT (SELECT min(t.chain) FROM agentpost.trail t
             WHERE t.chain >= 'human:' AND t.chain < 'human;'), 1
    UNION ALL
    SELECT (SELECT min(t.chain) FROM agentpost.trail t
             WHERE t.chain > p.chain AND t.chain < 'human;'), p.n + 1
      FROM people p
     WHERE p.chain IS NOT NULL AND p.n < %(limit)s
)
SELECT substr(chain, 7) FROM people WHERE chain IS NOT NULL
"""
# the newest recorded name of each id, in any space (index mark_agents_agent)
_RECORDED = """
SELECT DISTINCT ON (agent_id) agent_id::text, name
  FROM agentpost.mark_agents
 WHERE agent_id = ANY (%(ids)s::uuid[])
 ORDER BY agent_id, named_at DESC
"""

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def named(text: str, names: Mapping[str, str]) -> str:
    """`text` with each agent id that has a known name written ``'name' (id)``: the guard's
    reasons name agents by id only ("already claimed by agent <id>'s action")."""
    return _UUID.sub(lambda m: f"{names[m[0]]!r} ({m[0]})" if m[0] in names else m[0], text)


def ids_in(shown: Any) -> set[str]:
    """Every id (lower-case UUID text) in what a page shows: a text, or its data (mappings,
    lists, UUIDs), so whichever field names an agent, its name is looked up."""
    text = shown if isinstance(shown, str) else json.dumps(shown, default=str)
    return set(_UUID.findall(text.lower()))


def person_id(user: str) -> UUID:
    """The mark-space agent id of a person (the same user name, the same agent everywhere)."""
    return uuid5(PEOPLE, user)


def _operator_namespace() -> UUID:
    from agentpost.operators.marks import AGENT_NAMESPACE

    return AGENT_NAMESPACE


@lru_cache(maxsize=200_000)
def _derived(space: str | None, name: str) -> str:
    """The id of the agent `name`: a fleet's in `space`, or (None) an operator's."""
    if space is None:
        return str(uuid5(_operator_namespace(), name))
    return str(uuid5(FLEET_NAMESPACE, f"{space}/{name}"))


def derive(names: Iterable[str], people: Iterable[str], spaces: Iterable[str]
           ) -> dict[str, str]:
    """Agent id (text) -> name, for every way an id is derived from these names."""
    spaces = list(spaces)
    out = {str(SYSTEM_AGENT_ID): SYSTEM_AGENT_NAME}
    for name in names:
        out[_derived(None, name)] = name
        for space in spaces:
            out[_derived(space, name)] = name
    for user in people:
        out[str(person_id(user))] = f"human:{user}"
    return out


def recorded(store: EnvelopeStore, ids: Iterable[str]) -> dict[str, str]:
    """The recorded names of `ids` (at most MAX_IDS of them), the newest per id."""
    wanted = sorted(set(ids))[:MAX_IDS]
    if not wanted:
        return {}
    return dict(store.db.fetchall(_RECORDED, {"ids": wanted}))


def read(store: EnvelopeStore, spaces: Iterable[str], shown: Any) -> dict[str, str]:
    """Agent id (text) -> name for the ids in `shown` (`ids_in`): recorded, else derived
    for `spaces` (see the module docstring)."""
    workspaces = [r[0] for r in store.db.fetchall(_WORKSPACES, {"limit": MAX_WORKSPACES})]
    people = [r[0] for r in store.db.fetchall(_PEOPLE, {"limit": MAX_PEOPLE})]
    return {**derive(workspaces, people, spaces), **recorded(store, ids_in(shown))}


def page_names(request: Request, store: EnvelopeStore, spaces: Iterable[str],
               shown: Any) -> dict[str, str]:
    """The names a page shows for the ids in `shown`, and the signed-in person (who may
    not have acted yet)."""
    names = read(store, spaces, shown)
    user = getattr(request.state, "agentpost_user", None)
    if user is None:
        return names
    person = user_name(user)
    return {**names, str(person_id(person)): f"human:{person}"}
