"""agentpost as a common-messaging queue (issue 24): ``MessageQueueTrigger(scheme="agentpost",
workspace_id=...)`` finds our provider through Airflow's ProvidersManager and runs
InboxEventTrigger, claims and all.

Everything is real: common-messaging's own MessageQueueTrigger (its provider list built from
this distribution's provider info at import), Airflow's DAG serialization, Airflow's
SharedStreamManager driving the rebuilt trigger in ack mode (test_event_claims' `Triggerer`),
Postgres. The import guard runs in a subprocess in which common-messaging cannot import.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
from airflow.providers.common.messaging.triggers.msg_queue import (
    MESSAGE_QUEUE_PROVIDERS,
    MessageQueueTrigger,
)
from airflow.providers_manager import ProvidersManager
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.sdk.module_loading import import_string
from airflow.serialization.serialized_objects import DagSerialization

from agentpost.protocol.errors import InvalidInput
from agentpost.store import EnvelopeStore
from agentpost.triggers import InboxEventTrigger
from agentpost.triggers.messaging import CLASSPATH, AgentpostMessageQueueProvider
from test_event_claims import Triggerer, claims, started, until
from test_leases import send, topology

ROOT = Path(__file__).resolve().parents[2]


def private_airflow(home: Path) -> dict[str, str]:
    """The environment of a subprocess with its own Airflow home (nothing of ours leaks)."""
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}
    return {**env, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}


def queue_trigger(**kwargs: Any) -> MessageQueueTrigger:
    return MessageQueueTrigger(scheme="agentpost", **kwargs)


def legacy_queue_trigger(queue: str, **kwargs: Any) -> MessageQueueTrigger:
    """The queue-URI form, which common-messaging deprecates (and warns about)."""
    with pytest.warns(AirflowProviderDeprecationWarning):
        return MessageQueueTrigger(queue=queue, **kwargs)


def test_airflow_registers_the_agentpost_scheme() -> None:
    """ProvidersManager reads our provider info's `queues`; common-messaging instantiated
    exactly one provider for the scheme, ours."""
    assert CLASSPATH in ProvidersManager().queue_class_names
    ours = [p for p in MESSAGE_QUEUE_PROVIDERS if p.scheme_matches("agentpost")]
    assert len(ours) == 1 and type(ours[0]) is AgentpostMessageQueueProvider
    assert isinstance(ours[0], BaseMessageQueueProvider)
    assert not ours[0].scheme_matches("agentpost+other")


def test_the_scheme_builds_an_inbox_event_trigger_with_the_given_kwargs() -> None:
    mq = queue_trigger(workspace_id="agents/w1/inbox", watcher="dag:a", poll_interval=5,
                       min_interval=0.5, claim_timeout=900, agentpost_conn_id="other")
    trigger = mq.trigger
    assert type(trigger) is InboxEventTrigger
    assert (trigger.workspace_id, trigger.watcher, trigger.agentpost_conn_id) == (
        "w1", "dag:a", "other")
    assert (trigger.poll_interval, trigger.min_interval, trigger.claim_timeout) == (
        5.0, 0.5, 900.0)
    # the same watcher as InboxEventTrigger built directly: one stream, one set of claims
    direct = InboxEventTrigger("w1", watcher="dag:a", poll_interval=5, min_interval=0.5,
                               claim_timeout=900, agentpost_conn_id="other")
    assert mq.serialize() == direct.serialize()
    assert trigger.shared_stream_key() == direct.shared_stream_key()
    assert queue_trigger(workspace_id="w2").trigger.watcher == "inbox:w2"


def test_serialize_stores_our_class_path_and_rebuilds_the_trigger() -> None:
    """What Airflow stores for the watcher names InboxEventTrigger, not MessageQueueTrigger
    (the triggerer rebuilds it without common-messaging), and rebuilds the same trigger."""
    classpath, kwargs = queue_trigger(workspace_id="w1", watcher="dag:a").serialize()
    assert classpath == "agentpost.triggers.events.InboxEventTrigger"
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert type(rebuilt) is InboxEventTrigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["workspace_id"] == "w1" and kwargs["watcher"] == "dag:a"


@pytest.mark.parametrize("queue", ["agentpost://w1", "agentpost://agents/w1/inbox"])
def test_the_queue_uri_names_the_inbox(queue: str) -> None:
    trigger = legacy_queue_trigger(queue, watcher="dag:a").trigger
    assert type(trigger) is InboxEventTrigger
    assert (trigger.workspace_id, trigger.watcher) == ("w1", "dag:a")


@pytest.mark.parametrize(("queue", "message"), [
    ("agentpost://", "agentpost://<workspace>"),
    ("agentpost://w1?conn=x", "agentpost://<workspace>"),
    ("agentpost://a/b", "unknown stream form"),
])
def test_a_bad_queue_uri_is_a_clear_error(queue: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        legacy_queue_trigger(queue).serialize()


def test_the_queue_uri_and_workspace_id_together_are_refused() -> None:
    with pytest.raises(InvalidInput, match="names the inbox already"):
        legacy_queue_trigger("agentpost://w1", workspace_id="w2").serialize()


def test_another_queue_uri_is_not_ours() -> None:
    provider = AgentpostMessageQueueProvider()
    assert provider.queue_matches("agentpost://w1")
    assert not provider.queue_matches("kafka://agentpost")
    assert not provider.queue_matches("https://agentpost://x")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({}, TypeError, "workspace_id"),
    ({"workspace": "w1"}, TypeError, "workspace_id"),
    ({"workspace_id": ""}, InvalidInput, "workspace id"),
    ({"workspace_id": None}, InvalidInput, "workspace id"),
    ({"workspace_id": "a/b/c"}, InvalidInput, "unknown stream form"),
    ({"workspace_id": "w1", "conn_id": "mine"}, TypeError, "unexpected keyword.*conn_id"),
    ({"workspace_id": "w1", "poll_interval": 0}, InvalidInput, "poll_interval"),
])
def test_bad_kwargs_are_a_clear_error(kwargs: dict[str, Any], error: type[Exception],
                                      message: str) -> None:
    """Raised where Airflow first builds the trigger (serialize(), at DAG parse), with what
    is wrong; a misspelt keyword is refused rather than silently ignored."""
    mq = queue_trigger(**kwargs)
    with pytest.raises(error, match=message):
        mq.serialize()


def test_an_unknown_scheme_finds_no_provider() -> None:
    with pytest.raises(ValueError, match="'agentpost-inbox' is not recognized"):
        MessageQueueTrigger(scheme="agentpost-inbox", workspace_id="w1").serialize()


def test_a_dag_with_the_watcher_serializes_to_our_trigger() -> None:
    """The DAG as the dag processor stores it: the asset's watcher holds InboxEventTrigger's
    class path and kwargs, and deserializes to a trigger that rebuilds."""
    inbox = Asset(name="agentpost-inbox-w1", uri="agentpost://inbox/w1",
                  watchers=[AssetWatcher(name="w1-watcher", trigger=queue_trigger(
                      workspace_id="w1", watcher="dag:a"))])
    with DAG("agentpost_queue_test", schedule=[inbox]) as dag:
        pass
    data = json.loads(json.dumps(DagSerialization.to_dict(dag)))
    serialized = DagSerialization.from_dict(data)
    [(_, asset)] = list(serialized.timetable.asset_condition.iter_assets())
    [watcher] = asset.watchers
    assert watcher.name == "w1-watcher"
    classpath, kwargs = watcher.trigger["classpath"], watcher.trigger["kwargs"]
    assert classpath == "agentpost.triggers.events.InboxEventTrigger"
    assert import_string(classpath)(**kwargs).serialize() == (
        classpath, InboxEventTrigger("w1", watcher="dag:a").serialize()[1])


def test_a_dag_file_with_the_watcher_parses(tmp_path: Path) -> None:
    """A DAG file written as the docs show parses in Airflow's DagBag, in a subprocess with
    its own AIRFLOW_HOME (a DagBag reads Airflow's configuration)."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "queue_dag.py").write_text(DOC_EXAMPLE)
    code = ("import json, sys; from airflow.dag_processing.dagbag import DagBag; "
            "from airflow.serialization.serialized_objects import DagSerialization; "
            "bag = DagBag(dag_folder=sys.argv[1]); "
            "dag = bag.dags.get('triage_agent'); "
            "data = DagSerialization.to_dict(dag) if dag else None; "
            "print('RESULT ' + json.dumps({'errors': {k: str(v) for k, v in "
            "bag.import_errors.items()}, 'dag': data}))")
    proc = subprocess.run([sys.executable, "-c", code, str(dags)], capture_output=True,
                          text=True, env=private_airflow(tmp_path / "home"), timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["errors"] == {}
    assert ('"classpath": "agentpost.triggers.events.InboxEventTrigger"'
            in json.dumps(result["dag"]))
    assert '"workspace_id": "triage"' in json.dumps(result["dag"])


#: the example of docs/airflow.md ("MessageQueueTrigger"), checked to be there verbatim
DOC_EXAMPLE = '''\
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

trigger = MessageQueueTrigger(scheme="agentpost", workspace_id="triage", watcher="triage")
inbox = Asset(name="agentpost-inbox-triage", uri="agentpost://inbox/triage",
              watchers=[AssetWatcher(name="triage-watcher", trigger=trigger)])

with DAG("triage_agent", schedule=[inbox]) as dag:
    ...  # a task reads triggering_asset_events
'''


def test_the_docs_show_the_tested_example() -> None:
    assert DOC_EXAMPLE in (ROOT / "docs" / "airflow.md").read_text()


async def collect(mq: MessageQueueTrigger, into: list[dict[str, Any]]) -> None:
    events: AsyncIterator[Any]
    async with aclosing(mq.run()) as events:
        async for event in events:
            into.append(event.payload)


def watch(dsn: str) -> MessageQueueTrigger:
    return queue_trigger(workspace_id="w1", watcher="dag:a", dsn=dsn, poll_interval=0.5,
                         min_interval=0.05)


def test_run_yields_one_event_per_arrival_once_across_two_triggers(
        store: EnvelopeStore, dsn: str) -> None:
    """MessageQueueTrigger.run() (its trigger's standalone run, claims final at once):
    two triggers of the same watcher running at once yield every arrival, once between
    them, with the arrival's routing fields."""
    topology(store, ["w1"])

    async def scenario() -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
        await started(dsn)()
        a_events: list[dict[str, Any]] = []
        b_events: list[dict[str, Any]] = []
        tasks = [asyncio.create_task(collect(watch(dsn), a_events)),
                 asyncio.create_task(collect(watch(dsn), b_events))]
        await asyncio.sleep(0.3)
        sent = [send(store, "w1", f"m{i}") for i in range(8)]
        await until(lambda: len(a_events) + len(b_events) >= len(sent))
        await asyncio.sleep(1.5)  # anything yielded twice would be by now
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.2)  # the claim sessions close from short-lived threads
        return sent, a_events, b_events

    sent, a_events, b_events = asyncio.run(scenario())
    ids = [e["envelope_id"] for e in a_events + b_events]
    assert sorted(ids) == sorted(sent) and len(set(ids)) == len(ids)
    assert all(e["workspace_id"] == "w1" and e["watcher"] == "dag:a" and
               e["type"] == "directive" for e in a_events + b_events)
    assert sorted(c[0] for c in claims(dsn)) == sorted(sent)
    assert all(confirmed and reports == 1 for _, confirmed, reports in claims(dsn))


def test_two_triggerers_running_the_stored_watcher_report_each_arrival_once(
        store: EnvelopeStore, dsn: str) -> None:
    """The way Airflow runs it: the triggerer rebuilds what MessageQueueTrigger serialized
    (InboxEventTrigger) and runs it as a shared stream in ack mode; two triggerers with the
    same watcher split the arrivals, each stored once and its claim confirmed once."""
    topology(store, ["w1"])
    classpath, kwargs = watch(dsn).serialize()

    def rebuilt() -> InboxEventTrigger:
        return import_string(classpath)(**json.loads(json.dumps(kwargs)))

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        await started(dsn)()
        a, b = Triggerer(), Triggerer()
        a.start(rebuilt(), 1)
        b.start(rebuilt(), 2)
        sent = [send(store, "w1", f"m{i}") for i in range(10)]
        await until(lambda: len(a.stored) + len(b.stored) >= len(sent))
        await until(lambda: len(claims(dsn)) == len(sent)
                    and all(c for _, c, _ in claims(dsn)))
        await asyncio.sleep(1.5)  # anything reported twice would be by now
        await a.stop()
        await b.stop()
        return sent, a.stored, b.stored

    sent, from_a, from_b = asyncio.run(scenario())
    assert sorted(from_a + from_b) == sorted(sent)
    assert all(confirmed and reports == 1 for _, confirmed, reports in claims(dsn))


# Without common-messaging (an install without the `ai` extra): every other module of
# agentpost imports, agentpost.triggers does not pull the queue module in, the queue module
# says what to install, and Airflow's provider discovery skips the entry without failing.
WITHOUT_MESSAGING = """
import importlib, json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
# as if not installed: its modules do not import (its distribution's entry point stays, so
# Airflow's discovery still runs its provider info)
for hidden in ("providers", "providers.base_provider", "triggers", "triggers.msg_queue"):
    sys.modules["airflow.providers.common.messaging." + hidden] = None
import agentpost, agentpost.triggers, agentpost.provider_info
pulled = "agentpost.triggers.messaging" in sys.modules
broken, modules = {}, set()
for root in ("agentpost", "agentpost.operators"):
    package = importlib.import_module(root)
    modules.update(m.name for m in pkgutil.walk_packages(package.__path__, root + "."))
modules.discard("agentpost.triggers.messaging")
for name in sorted(modules):
    try:
        importlib.import_module(name)
    except Exception as exc:
        broken[name] = f"{type(exc).__name__}: {exc}"
try:
    importlib.import_module("agentpost.triggers.messaging")
    guard = None
except Exception as exc:
    guard = [type(exc).__name__, str(exc)]
from airflow.providers_manager import ProvidersManager
queues = ProvidersManager().queue_class_names
print("RESULT " + json.dumps({"pulled": pulled, "broken": broken, "count": len(modules),
                              "guard": guard, "queues": queues}))
"""


def test_agentpost_imports_without_common_messaging(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MESSAGING], capture_output=True,
                          text=True, env=private_airflow(tmp_path / "home"), timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["pulled"] is False
    assert result["broken"] == {} and result["count"] > 50
    name, message = result["guard"]
    assert name == "AirflowOptionalProviderFeatureException"
    assert "airflow-agentpost[ai]" in message and "common-messaging" in message
    assert CLASSPATH not in result["queues"]


def test_agentpost_triggers_does_not_import_the_queue_module(tmp_path: Path) -> None:
    """Also with common-messaging installed, importing agentpost's triggers does not load
    the queue module (only Airflow's discovery, through the provider info, does)."""
    code = ("import sys, agentpost.triggers, agentpost.provider_info, "
            "agentpost.factories.reactive; "
            "print('agentpost.triggers.messaging' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=private_airflow(tmp_path / "home"), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"
