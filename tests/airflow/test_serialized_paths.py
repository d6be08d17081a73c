"""Class paths that live outside this checkout keep importing (issue 23, item 5).

Airflow keeps a deferred task's trigger in its metadata database as the class path the
trigger's `serialize()` returned, and the triggerer imports that path again, possibly after an
upgrade moved the code; serialized DAGs name operators and their extra links by class path;
an installed distribution's metadata names our entry points, and the provider info its
common-messaging queue provider. A module moved without a shim at its old path strands
whatever was stored under it, and nothing else in the suite notices until a triggerer fails
on a stored row.

`STORED` is every path we know may be stored somewhere, with the class it must resolve to
(named by its home). Old paths stay in it for good (`agentpost.command_triggers`, where
CommandTrigger lived first and still serializes to; `agentpost.operators.inbox`, where
InboxSensor did); every path a trigger serializes to today must be in it, so a trigger whose
path changes keeps its old one listed, and importable.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import BaseOperatorLink
from airflow.sdk.module_loading import import_string
from airflow.triggers.base import BaseTrigger

import agentpost.triggers
from agentpost.provider_info import get_provider_info

REPO = Path(__file__).resolve().parents[2]

#: stored path -> the path of the object it must be (its home today)
STORED = {
    # triggers: what serialize() returns, now and before
    "agentpost.command_triggers.CommandTrigger": "agentpost.triggers.commands.CommandTrigger",
    "agentpost.triggers.InboxTrigger": "agentpost.triggers.inbox.InboxTrigger",
    "agentpost.triggers.events.InboxEventTrigger": "agentpost.triggers.events.InboxEventTrigger",
    "agentpost.triggers.needs.NeedResolvedTrigger": "agentpost.triggers.needs.NeedResolvedTrigger",
    "agentpost.triggers.replies.ReplyTrigger": "agentpost.triggers.replies.ReplyTrigger",
    "agentpost.triggers.verdicts.VerdictTrigger": "agentpost.triggers.verdicts.VerdictTrigger",
    # operators DAGs were written against, and serialized DAGs name by module
    "agentpost.operators.inbox.InboxSensor": "agentpost.operators.sensors.InboxSensor",
    # extra links (provider info "extra-links", the plugin's operator_extra_links)
    "agentpost.web.links.CommandLink": "agentpost.web.links.CommandLink",
    "agentpost.web.links.EnvelopeLink": "agentpost.web.links.EnvelopeLink",
    "agentpost.web.links.MarkLink": "agentpost.web.links.MarkLink",
    "agentpost.web.links.RouteLink": "agentpost.web.links.RouteLink",
    "agentpost.web.links.TrailAnalyticsLink": "agentpost.web.links.TrailAnalyticsLink",
    # common-messaging queue providers (provider info "queues", read by Airflow at discovery)
    "agentpost.triggers.messaging.AgentpostMessageQueueProvider":
        "agentpost.triggers.messaging.AgentpostMessageQueueProvider",
    # entry points, as installed metadata names them (module:attribute)
    "agentpost.provider_info:get_provider_info": "agentpost.provider_info.get_provider_info",
    "agentpost.web.plugin:AgentpostPlugin": "agentpost.web.plugin.AgentpostPlugin",
    "agentpost.cli:main": "agentpost.cli.main",
}

#: one instance of every concrete trigger, built as a task would (nothing touches a store)
SAMPLES: dict[str, dict[str, Any]] = {
    "CommandTrigger": {"command_id": "c-1", "workspace": "worker-a", "poll_interval": 2.0},
    "InboxEventTrigger": {"workspace_id": "worker-a", "watcher": "w-1", "poll_interval": 2.0},
    "InboxTrigger": {"workspace_id": "worker-a", "min_envelopes": 2, "type": "task",
                     "not_before": 1_700_000_000.0, "end_task": True},
    "NeedResolvedTrigger": {"need_id": "00000000-0000-4000-8000-000000000001",
                            "space": "default"},
    "ReplyTrigger": {"envelope_id": "e-1", "type": "answer"},
    "VerdictTrigger": {"scope": "deploy", "resource": "prod", "space": "default",
                       "agent_id": "00000000-0000-4000-8000-000000000002"},
}


def resolve(path: str) -> Any:
    """A stored path as Airflow resolves it (an entry point's ``module:attribute`` too)."""
    return import_string(path.replace(":", "."))


def concrete_triggers() -> dict[str, type[BaseTrigger]]:
    """Every trigger class defined in agentpost.triggers that can be instantiated."""
    found = {}
    for info in pkgutil.walk_packages(agentpost.triggers.__path__, "agentpost.triggers."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, BaseTrigger)
                    and cls.__module__ == info.name and not inspect.isabstract(cls)):
                found[cls.__name__] = cls
    return found


@pytest.mark.parametrize("path", sorted(STORED))
def test_every_stored_path_imports_the_class_it_names(path: str) -> None:
    assert resolve(path) is resolve(STORED[path]), f"{path} no longer names {STORED[path]}"


def test_every_trigger_has_a_sample() -> None:
    """A new trigger needs a sample here, so that the path it serializes to is checked."""
    assert sorted(concrete_triggers()) == sorted(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_trigger_serializes_to_a_stored_path_that_rebuilds_it(name: str) -> None:
    cls = concrete_triggers()[name]
    classpath, kwargs = cls(**SAMPLES[name]).serialize()
    assert classpath in STORED, (
        f"{name} serializes to {classpath}: add it to STORED (and keep the old path there)")
    assert resolve(classpath) is cls
    rebuilt = resolve(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def test_every_link_and_registered_class_path_is_stored() -> None:
    """The provider info's extra links, the plugin's, the connection type's hook, and the
    listed modules all import; every link path is in STORED."""
    info = get_provider_info()
    links = info["extra-links"]
    from agentpost.web.plugin import AgentpostPlugin

    plugin_links = [f"{type(link).__module__}.{type(link).__qualname__}"
                    for link in AgentpostPlugin.operator_extra_links]
    assert sorted(plugin_links) == sorted(links)
    for path in links:
        assert path in STORED, f"extra link {path}: add it to STORED"
        assert issubclass(resolve(path), BaseOperatorLink)
    [conn] = info["connection-types"]
    assert resolve(conn["hook-class-name"]).conn_type == "agentpost"
    for kind in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)


def test_every_entry_point_is_stored() -> None:
    """pyproject's scripts and entry points: installed metadata keeps naming them until the
    distribution is reinstalled."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    targets = [*project["scripts"].values(),
               *(t for group in project["entry-points"].values() for t in group.values())]
    assert targets
    for target in targets:
        assert target in STORED, f"entry point {target}: add it to STORED"


def test_every_queue_provider_is_stored_and_its_trigger_serializes_to_a_stored_path() -> None:
    """The provider info's queue providers (MessageQueueTrigger's scheme lookup) are in
    STORED, and the trigger each one builds, what Airflow stores for a watcher written as
    ``MessageQueueTrigger(scheme=...)``, serializes to a stored path that rebuilds it."""
    from airflow.providers.common.messaging.providers.base_provider import (
        BaseMessageQueueProvider,
    )

    queues = get_provider_info()["queues"]
    assert queues
    for path in queues:
        assert path in STORED, f"queue provider {path}: add it to STORED"
        provider = resolve(path)()
        assert isinstance(provider, BaseMessageQueueProvider)
        cls = provider.trigger_class()
        classpath, kwargs = cls(**SAMPLES[cls.__name__]).serialize()
        assert classpath in STORED and resolve(classpath) is cls
        assert resolve(classpath)(**json.loads(json.dumps(kwargs))).serialize() == (
            classpath, kwargs)
