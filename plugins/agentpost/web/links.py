"""Operator extra links: from a task instance of an agentpost operator or sensor to the page of
the envelope, command, mark or route it produced.

Airflow computes a link once, where the task ends: a worker calls `get_link` after the task
ran and keeps the URL in XCom ``_link_<ClassName>``, which the UI reads. Each operator says
where its id is (`agentpost_links`: a `LinkSource` per page kind). A sensor that ends from the
triggerer never reaches a worker, so its trigger computes the same URLs from the result with
`link_xcoms` and puts them in the success event's XComs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

PREFIX = "/agentpost"
RETURN_VALUE = "return_value"


@dataclass(frozen=True)
class LinkSource:
    """Where a task's id for one page kind is: in XCom `key`, at `path` (keys or list
    indexes into the value; empty: the value itself). `space_attr`: the operator attribute
    naming the mark space (mark pages need it); `space_path`: the same, read from the value."""

    path: tuple[str | int, ...] = ()
    key: str = RETURN_VALUE
    space_attr: str | None = None
    space_path: tuple[str | int, ...] | None = None


def base_url() -> str:
    """Airflow's ``[api] base_url`` without a trailing slash; empty (relative links) when unset."""
    from airflow.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def page_url(kind: str, ident: str, space: str | None = None) -> str:
    """The agentpost page of `ident` (``envelopes``, ``commands``, ``marks``, ``routes``)."""
    url = f"{base_url()}{PREFIX}/{kind}/{quote(str(ident), safe=':')}"
    return f"{url}?{urlencode({'space': space})}" if space is not None else url


def dig(value: Any, path: Sequence[str | int]) -> Any:
    """`value` at `path`, or None where the path does not exist (a failed or empty result)."""
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def source_url(kind: str, source: LinkSource, read: Callable[[str], Any],
               space: str | None = None) -> str:
    """The URL for `source`, reading XComs with `read`; empty when the task produced no id
    (Airflow shows no link for an empty one)."""
    ident = dig(read(source.key), source.path)
    if ident is None or ident == "" or isinstance(ident, dict | list):
        return ""
    if source.space_path is not None:
        space = dig(read(source.key), source.space_path)
    if kind == "marks" and not space:
        space = "default"
    return page_url(kind, str(ident), space)


def _operator_sources(operator: Any) -> dict[str, tuple[LinkSource, str | None]]:
    """Per page kind, where `operator`'s id is and the mark space its attribute names: what
    a worker (`PageLink.get_link`) and a trigger (`trigger_links`) both read off it."""
    return {kind: (source, getattr(operator, source.space_attr, None)
                   if source.space_attr else None)
            for kind, source in getattr(operator, "agentpost_links", {}).items()}


class PageLink:
    """What the link classes share (a mixin, so that only the concrete links are
    BaseOperatorLinks for Airflow's provider registry): one agentpost page kind per class;
    the operator's `agentpost_links` says where the id is."""

    kind: ClassVar[str] = ""

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.bases.xcom import BaseXCom

        found = _operator_sources(operator).get(self.kind)
        if found is None:
            return ""
        source, space = found
        return source_url(self.kind, source,
                          lambda key: BaseXCom.get_value(ti_key=ti_key, key=key), space)


class EnvelopeLink(PageLink, BaseOperatorLink):
    name = "Envelope"
    kind = "envelopes"


class CommandLink(PageLink, BaseOperatorLink):
    name = "Command"
    kind = "commands"


class MarkLink(PageLink, BaseOperatorLink):
    name = "Mark"
    kind = "marks"


class RouteLink(PageLink, BaseOperatorLink):
    name = "Route"
    kind = "routes"


class TrailAnalyticsLink(BaseOperatorLink):
    """From a Spark job's task (`TrailJobOperator`) to the analytics view, which shows what
    the analytics wrote and the audit's latest reports."""

    name = "Trail analytics"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return f"{base_url()}{PREFIX}/analytics"


EXTRA_LINKS: list[type[BaseOperatorLink]] = [EnvelopeLink, CommandLink, MarkLink, RouteLink,
                                             TrailAnalyticsLink]
_BY_KIND = {link.kind: link for link in EXTRA_LINKS if issubclass(link, PageLink)}


def links_for(sources: Mapping[str, LinkSource]) -> tuple[BaseOperatorLink, ...]:
    """The link instances for an operator's `agentpost_links` (its operator_extra_links)."""
    return tuple(_BY_KIND[kind]() for kind in sources)


def trigger_links(operator: Any) -> list[list[Any]]:
    """What a trigger needs to compute `operator`'s link XComs from its result, serializable:
    ``[xcom_key, kind, path, space, space_path]`` per link reading the return value."""
    specs = []
    for kind, (source, space) in _operator_sources(operator).items():
        if source.key != RETURN_VALUE:
            continue
        specs.append([_BY_KIND[kind]().xcom_key, kind, list(source.path), space,
                      None if source.space_path is None else list(source.space_path)])
    return specs


def link_xcoms(specs: Sequence[Sequence[Any]], result: Any) -> dict[str, str]:
    """The link XComs for a task whose return value is `result` (see `trigger_links`)."""
    out = {}
    for xcom_key, kind, path, space, space_path in specs:
        source = LinkSource(path=tuple(path),
                            space_path=None if space_path is None else tuple(space_path))
        url = source_url(kind, source, lambda _key: result, space)
        if url:
            out[xcom_key] = url
    return out


# ---- from an agent's tool call to the Airflow task instance that made it -----------------

#: a run id's trailing UTC offset (``+00:00``): its minutes are not a map index
_OFFSET_HOURS = re.compile(r"[+-]\d\d$")


def task_instance_url(dag_id: str, task_id: str, run_id: str,
                      map_index: int | None = None) -> str:
    """Airflow's UI page of one task instance (the form of Airflow's own ``log_url``)."""
    url = (f"{base_url()}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
           f"/tasks/{quote(task_id, safe='')}")
    return f"{url}/mapped/{map_index}" if map_index is not None and map_index >= 0 else url


def parse_af_ref(ref: str) -> dict[str, Any] | None:
    """dag_id, task_id, run_id, map_index of an ``af:<dag>:<task>:<run>[:<map>]`` ref, or
    None. A dag or task id holds no ``:``; a run id may (``+00:00``), so a trailing
    ``:<digits>`` is a map index only when written as ints are (no leading zero) and what
    precedes it does not end in an offset's hours. A recorded run's ``attrs`` say it
    without guessing; a lease holder is only the ref."""
    parts = ref.split(":", 3)
    if len(parts) < 4 or parts[0] != "af" or not all(parts[1:]):
        return None
    _, dag_id, task_id, rest = parts
    run_id, map_index = rest, None
    head, sep, tail = rest.rpartition(":")
    if (sep and head and tail.isdigit() and (tail == "0" or not tail.startswith("0"))
            and not _OFFSET_HOURS.search(head)):
        run_id, map_index = head, int(tail)
    return {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "map_index": map_index}


def run_link(run: Mapping[str, Any] | None, ref: str | None = None) -> dict[str, Any]:
    """How a page shows the run of a tool call: ``ref``, ``by``, ``transport`` (an MCP run's),
    and ``url``, the Airflow task instance's page when the run is a task instance (from its
    ``attrs``, else from its ``af:`` ref), else None. `run`: the recorded RunInfo (a dict);
    `ref`: a bare ref (a lease holder) when there is no RunInfo."""
    run = run if isinstance(run, Mapping) else {}
    ref = str(run.get("ref") or ref or "")
    attrs = run.get("attrs") if isinstance(run.get("attrs"), Mapping) else {}
    by = str(run.get("by") or {"af": "airflow"}.get(ref.partition(":")[0],
                                                     ref.partition(":")[0]))
    found: dict[str, Any] | None = None
    if all(isinstance(attrs.get(k), str) and attrs.get(k) for k in ("dag_id", "task_id",
                                                                     "run_id")):
        index = attrs.get("map_index")
        found = {"dag_id": attrs["dag_id"], "task_id": attrs["task_id"],
                 "run_id": attrs["run_id"],
                 "map_index": index if isinstance(index, int) else None}
    elif ref.startswith("af:"):
        found = parse_af_ref(ref)
    transport = attrs.get("transport") if by == "mcp" else None
    if by == "mcp" and not transport and ref.startswith("mcp:"):
        transport = ref.split(":")[1] if ref.count(":") else None
    return {"ref": ref, "by": by or None, "transport": transport,
            "task": found, "url": task_instance_url(**found) if found else None}
