"""Operators on the Markspace mark space (docs/marks.md): write a mark, and run a side effect
through the guard so that it happens only when the guard allows it (Markspace §9.2, P37).

**The space.** A `PostgresMarkSpace` in the store's database (the hook's DSN), named by
`space` (default ``"default"``); many named spaces live side by side there.

**Scopes** are configuration, not data (Markspace §7.1: a scope's rules live with the code
that uses it), so a DAG author declares them beside the operator: ``scopes=[Scope(...)]``,
or a callable returning them (called at run time, e.g. to share one list between DAGs
from a module). Every operator on one space must declare the scopes it touches.

**Agents** must keep their identity across tasks and DAG runs, because the guard tells an
agent's own intent from another's by its id. Give an `Agent` with a fixed ``id``, or a name:
`stable_agent` then makes one whose id is derived from the name (uuid5), permitted to write
what the operator writes in its scope.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from agentpost.hooks import AgentpostHook
from agentpost.marks import (
    Action,
    Agent,
    Guard,
    Intent,
    MarkType,
    Need,
    Observation,
    PostgresMarkSpace,
    Scope,
    Verdict,
    Warning,
)
from agentpost.marks.core import scope_ancestors
from agentpost.marks.keys import KeyRecord, UnsettledCall
from agentpost.operators.commands import default_key
from agentpost.operators.common import StoreOperator, is_template
from agentpost.protocol.errors import AgentpostError, InvalidInput
from agentpost.web.links import LinkSource, links_for
from agentpost.web.names import named
from agentpost.web.names import read as read_names

if TYPE_CHECKING:
    from collections.abc import Iterator

    from airflow.sdk import Context

    from agentpost.marks.guard import GuardDecision

#: the namespace of agent ids derived from names (`stable_agent`)
AGENT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "agentpost:airflow:agent")
MARK_CLASSES = {MarkType.INTENT: Intent, MarkType.ACTION: Action,
                MarkType.OBSERVATION: Observation, MarkType.WARNING: Warning,
                MarkType.NEED: Need}
#: what the guard's `write_mark` accepts; intents and actions go through pre/post_action
GUARDED_WRITES = frozenset({MarkType.OBSERVATION, MarkType.WARNING, MarkType.NEED})

ScopesSpec = Iterable[Scope] | Callable[[], Iterable[Scope]]


def stable_agent(name: str, scopes: Mapping[str, Sequence[MarkType | str]]) -> Agent:
    """An agent whose id is derived from `name`: the same in every task and DAG run."""
    return Agent(id=uuid.uuid5(AGENT_NAMESPACE, name), name=name,
                 scopes={scope: tuple(types) for scope, types in scopes.items()})


def _scopes_of(spec: ScopesSpec) -> list[Scope]:
    scopes = list(spec() if callable(spec) else spec)
    for scope in scopes:
        if not isinstance(scope, Scope):
            raise InvalidInput(f"scopes must be Scope objects, not {type(scope).__name__}")
    return scopes


def _check_agent(agent: object) -> Agent | str:
    if isinstance(agent, Agent) or (isinstance(agent, str) and agent.strip()):
        return agent
    raise InvalidInput("agent must be an Agent (with a fixed id) or an agent name")


class _MarksOperator(StoreOperator):
    """The space, the scopes and the agent an operator on marks needs."""

    def __init__(self, *, agent: Agent | str, scopes: ScopesSpec = (),
                 space: str = "default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(scopes):
            scopes = _scopes_of(scopes)  # a bad list is a parse-time error
        self.agent = _check_agent(agent)
        self.scopes = scopes
        self.space = space

    def _agent(self, scope: str, types: Sequence[MarkType]) -> Agent:
        if isinstance(self.agent, Agent):
            return self.agent
        return stable_agent(self.agent, {scope: types})

    @contextmanager
    def _marks(self) -> Iterator[PostgresMarkSpace]:
        with self.errors():
            dsn = AgentpostHook(self.agentpost_conn_id).get_dsn()
            with PostgresMarkSpace(dsn=dsn, scopes=_scopes_of(self.scopes),
                                   space=self.space) as marks:
                yield marks


class WriteMarkOperator(_MarksOperator):
    """Writes one mark; returns its id (XCom). At most one mark per task instance: the mark
    is recorded under the instance's key (`instance_key`), so a retry writes nothing new
    and returns the first try's mark id.

    :param mark_type: ``intent``, ``action``, ``observation``, ``warning`` or ``need``.
    :param scope: the scope (templated).
    :param fields: the mark's other fields (templated), e.g. ``{"topic": "weather",
        "content": {...}}`` for an observation, ``{"question": ..., "blocking": True}`` for a
        need.
    :param via: ``"guard"`` (the default): through `Guard.write_mark`, the single enforcement
        boundary for observations, warnings and needs (budget, barrier, rate limit, envelope);
        ``"space"``: straight into the space (any type; intents and actions written so skip
        the guard's conflict resolution: use `GuardedActionOperator` for those).
    :param agent, scopes, space: see the module docstring.
    """

    template_fields: Sequence[str] = ("scope", "fields", "agentpost_conn_id")
    template_fields_renderers = {"fields": "json"}
    agentpost_links = {"marks": LinkSource(space_attr="space")}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#f2ecd9"

    def __init__(self, *, mark_type: MarkType | str, scope: str,
                 fields: Mapping[str, Any] | None = None,
                 via: Literal["guard", "space"] = "guard", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mark_type not in set(MarkType):
            raise InvalidInput(f"mark_type must be one of {', '.join(MarkType)}, "
                               f"not {mark_type!r}")
        if via not in ("guard", "space"):
            raise InvalidInput(f"via must be 'guard' or 'space', not {via!r}")
        if via == "guard" and mark_type not in GUARDED_WRITES:
            raise InvalidInput(f"a {mark_type} goes through the guard's pre/post action: use "
                               "GuardedActionOperator, or via='space'")
        self.mark_type = MarkType(mark_type)
        self.scope = scope
        self.fields = dict(fields or {})
        self.via = via

    def execute(self, context: Context) -> str:
        """Write the mark once per task instance: a retry returns the first try's mark id."""
        with self._marks() as marks:
            mark = MARK_CLASSES[self.mark_type](scope=self.scope, **self.fields)
            agent = self._agent(self.scope, (self.mark_type,))
            write = Guard(marks).write_mark if self.via == "guard" else marks.write
            mark_id, written = marks.write_once(agent, mark, instance_key(context), write)
        if written:
            self.log.info("wrote %s %s in %s/%s via the %s", self.mark_type.value, mark_id,
                          self.space, self.scope, self.via)
        else:
            self.log.info("an earlier try wrote %s %s in %s/%s: nothing written",
                          self.mark_type.value, mark_id, self.space, self.scope)
        return str(mark_id)


class GuardRefused(AirflowFailException):
    """The guard did not allow the action (CONFLICT, BLOCKED or DENIED); nothing ran."""


#: verdicts that come from contention with other agents: `on_refused` decides what they do
#: to the task. DENIED comes from configuration (a verb the scope does not allow, an agent
#: without permission, a barrier, a budget) and fails the task whatever `on_refused` says.
CONTENTION = frozenset({Verdict.CONFLICT, Verdict.BLOCKED})


class GuardedActionOperator(_MarksOperator):
    """Runs `python_callable(*op_args, **op_kwargs)` through `Guard.execute`: the intent is
    written and checked under the resource's lock, the callable runs only on ALLOW, and its
    result (a JSON object) is recorded as the action mark and returned as XCom. The decision
    goes to the XCom key ``decision`` (``verdict``, ``reason``, ``check``, ``intent_id``).

    At most once per task instance (`Guard.execute_once` under `instance_key`): a retry
    after the action was recorded replays its recorded result (the action mark's JSON
    object) without calling; a retry after a try that started the callable and recorded
    nothing (its worker died) fails without calling, since it may have acted, and says what
    to check; a retry after the callable raised calls it again.

    :param scope, resource: what the action is on (templated).
    :param intent_action, result_action: the intent's verb and the action's verb.
    :param on_refused: what contention does to the task (CONFLICT or BLOCKED: another agent
        holds or contends for the resource, a normal outcome of coordination): ``"skip"``
        (the default) or ``"fail"`` (no retries). A DENIED verdict (a verb the scope does
        not allow, no permission, a barrier or budget) is configuration, not contention: it
        always fails the task (`GuardRefused`), so a typo never looks green. Either way the
        verdict and its reason are in the log and the exception's message.
    :param confidence: the intent's confidence (conflict policies weigh it).
    :param agent, scopes, space: see the module docstring.
    """

    template_fields: Sequence[str] = ("scope", "resource", "op_args", "op_kwargs",
                                      "agentpost_conn_id")
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    #: the intent the guard wrote for the action
    agentpost_links = {"marks": LinkSource(key="decision", path=("intent_id",),
                                           space_attr="space")}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#f2ecd9"

    def __init__(self, *, python_callable: Callable[..., Any], scope: str, resource: str,
                 intent_action: str, result_action: str | None = None,
                 op_args: Collection[Any] | None = None,
                 op_kwargs: Mapping[str, Any] | None = None, confidence: float = 1.0,
                 on_refused: Literal["skip", "fail"] = "skip", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(python_callable):
            raise InvalidInput("python_callable must be callable")
        if on_refused not in ("skip", "fail"):
            raise InvalidInput(f"on_refused must be 'skip' or 'fail', not {on_refused!r}")
        self.python_callable = python_callable
        self.scope = scope
        self.resource = resource
        self.intent_action = intent_action
        self.result_action = result_action or intent_action
        self.op_args = list(op_args or ())
        self.op_kwargs = dict(op_kwargs or {})
        self.confidence = confidence
        self.on_refused = on_refused
        self._check_configuration()

    def _check_configuration(self) -> None:
        """What configuration alone decides fails when the DAG is parsed, where the scopes
        are a list (a fleet file's, say) and the scope and verbs are not templates: the
        scope is defined (or under a defined one) and it allows both verbs. The agent's
        permissions, barriers and budgets are the guard's to judge at run time (DENIED)."""
        if callable(self.scopes) or any(is_template(v) for v in (
                self.scope, self.intent_action, self.result_action)):
            return
        try:
            self._require_verbs(self.scopes)
        except InvalidInput as exc:
            raise InvalidInput(f"{self.task_id}: {exc}") from None

    def _require_verbs(self, scopes: Sequence[Scope]) -> None:
        """InvalidInput unless `scopes` define the scope and it allows both verbs."""
        found = scope_definition(scopes, self.scope)
        if found is None:
            raise InvalidInput(f"scope {self.scope!r} is not among the scopes given "
                               f"({', '.join(s.name for s in scopes) or 'none'})")
        for kind, verb, allowed in (("intent", self.intent_action, found.allowed_intent_verbs),
                                    ("action", self.result_action,
                                     found.allowed_action_verbs)):
            if allowed and verb not in allowed and "*" not in allowed:
                raise InvalidInput(f"{kind} verb {verb!r} is not allowed in scope "
                                   f"{found.name!r} (allowed: {', '.join(allowed)})")

    def execute(self, context: Context) -> Any:
        """One guarded call per task instance (its key: `instance_key`): a retry replays the
        recorded result, or refuses when an earlier try's call recorded no outcome."""
        key = instance_key(context)
        with self.errors():
            self._require_verbs(_scopes_of(self.scopes))  # as rendered, scopes as called
        with self._marks() as marks:
            agent = self._agent(self.scope, (MarkType.INTENT, MarkType.ACTION))
            try:
                decision, result, replayed = Guard(marks).execute_once(
                    key, agent, self.scope, self.resource, self.intent_action,
                    self.result_action,
                    lambda: self.python_callable(*self.op_args, **self.op_kwargs),
                    confidence=self.confidence)
            except UnsettledCall as exc:
                raise AirflowFailException(self._unsettled(exc.record)) from None
        context["ti"].xcom_push(key="decision", value=_decision_json(decision))
        if decision.verdict is Verdict.ALLOW:
            self.log.info("guard allowed %s on %s/%s: %s", self.result_action, self.scope,
                          self.resource, "an earlier try's recorded result is replayed, the "
                          "callable is not called again" if replayed else "the callable ran")
            return result
        reason = _explain(decision)
        message = f"{self.task_id}: {named(reason, self._agent_names(reason))}"
        self.log.warning("%s", message)
        if decision.verdict in CONTENTION and self.on_refused == "skip":
            raise AirflowSkipException(message)
        raise GuardRefused(message)


    def _agent_names(self, reason: str) -> dict[str, str]:
        """The names of the agents `reason` names by id, as the pages know them
        (`agentpost.web.names`: recorded, else derived), so that a refusal says who holds
        the resource; none when the store cannot be read."""
        try:
            with AgentpostHook(self.agentpost_conn_id).get_store(check=False) as store:
                return read_names(store, [self.space], reason)
        except AgentpostError:
            return {}

    def _unsettled(self, record: KeyRecord) -> str:
        """Why the try refuses, and what a person checks and does."""
        started = datetime.fromtimestamp(record.started_at, UTC).isoformat(timespec="seconds")
        return (f"{self.task_id}: an earlier try started the callable at {started} (guard "
                f"allowed {self.intent_action!r} on {record.resource!r} in scope "
                f"{record.scope!r}, space {self.space!r}) and recorded no outcome: its worker "
                "died or it raised a BaseException mid-call, so the callable may or may not "
                "have run, and it is not called again. Check whether the effect happened; "
                "then mark this task instance success, or release the call with "
                f"`agentpost mark-key release {record.key!r} --space {self.space!r}` "
                "and clear the task to run it again")


def scope_definition(scopes: Iterable[Scope], name: str) -> Scope | None:
    """The scope governing `name` among `scopes`: its own, else its nearest defined
    ancestor's (the space's hierarchical lookup), else None."""
    by_name = {s.name: s for s in scopes}
    return next((by_name[c] for c in scope_ancestors(name) if c in by_name), None)


def instance_key(context: Context) -> str:
    """The mark space key of a task instance: the same on every try (no try number)."""
    ti = context["ti"]
    return default_key(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)


def _decision_json(decision: GuardDecision) -> dict[str, Any]:
    return {"verdict": decision.verdict.value, "reason": decision.reason,
            "check": decision.check.value if decision.check else None,
            "intent_id": str(decision.intent_id) if decision.intent_id else None}


def _explain(decision: GuardDecision) -> str:
    """One line: the verdict, the check that decided, its reason, and who holds the resource."""
    text = f"guard verdict {decision.verdict.value.upper()}"
    if decision.check is not None:
        text += f" ({decision.check.value})"
    if decision.reason:
        text += f": {decision.reason}"
    holder = decision.winning_action or decision.winning_intent
    if holder is not None:
        text += f"; held by agent {holder.agent_id}"
    return text + "; the callable did not run"


__all__ = ["GuardRefused", "GuardedActionOperator", "WriteMarkOperator", "stable_agent"]
