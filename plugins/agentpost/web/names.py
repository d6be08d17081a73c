"""Agent names for the pages. The mark space records an agent by its id (a UUID) only; no
table of the store maps ids to names (`Agent.name` lives in each process). But the ids the
project hands out are derived from names, so the page can tell a name by deriving the id of
every name the store knows of and matching:

- a fleet's agent: ``uuid5(fleet AGENT_NAMESPACE, "<space>/<name>")`` (protocol/fleet.py),
- an operator's agent given by name: ``uuid5(operators AGENT_NAMESPACE, name)``
  (`stable_agent`),
- a person on the page: ``uuid5(PEOPLE, user)``, named ``human:<user>``,
- the guard's own agent (``markspace-guard``).

The names tried are the store's workspace ids (fleets name their agents after their
workspaces, as dags/fleet.yaml does) and the people of the trail's ``human:<user>`` chains.
A match is exact (a UUIDv5 is a hash of the name), so a name shown is the agent's own; an
agent named otherwise (or with a random id) keeps its id. The names are read on every
page (two short index reads), so a workspace or person added shows at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from uuid import NAMESPACE_URL, UUID, uuid5

from fastapi import Request

from agentpost.marks.guard import SYSTEM_AGENT_ID, SYSTEM_AGENT_NAME
from agentpost.protocol.fleet import AGENT_NAMESPACE as FLEET_NAMESPACE
from agentpost.store import EnvelopeStore
from agentpost.web.auth import user_name

#: agent ids of people: uuid5 of their user name in this namespace (docs/ui.md)
PEOPLE = uuid5(NAMESPACE_URL, "agentpost:human")
#: how many workspace ids and people are tried at most
MAX_WORKSPACES = 5_000
MAX_PEOPLE = 1_000

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


_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def named(text: str, names: Mapping[str, str]) -> str:
    """`text` with each agent id that has a known name written ``'name' (id)``: the guard's
    reasons name agents by id only ("already claimed by agent <id>'s action")."""
    return _UUID.sub(lambda m: f"{names[m[0]]!r} ({m[0]})" if m[0] in names else m[0], text)


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


def read(store: EnvelopeStore, spaces: Iterable[str]) -> dict[str, str]:
    """The names the store knows of, derived for `spaces` (see the module docstring): two
    short index reads; the ids derived from a name are computed once per process."""
    workspaces = [r[0] for r in store.db.fetchall(_WORKSPACES, {"limit": MAX_WORKSPACES})]
    people = [r[0] for r in store.db.fetchall(_PEOPLE, {"limit": MAX_PEOPLE})]
    return derive(workspaces, people, spaces)


def page_names(request: Request, store: EnvelopeStore, spaces: Iterable[str]) -> dict[str, str]:
    """The names a page shows: those the store knows of for `spaces`, and the signed-in
    person (who may not have acted yet)."""
    names = read(store, spaces)
    user = getattr(request.state, "agentpost_user", None)
    if user is None:
        return names
    person = user_name(user)
    return {**names, str(person_id(person)): f"human:{person}"}
