"""The distribution registers itself as an Airflow provider, and its provider info is complete.

Airflow finds the `agentpost` connection type, its hook, the listed modules and the
common-messaging queue provider through the entry point; and every hook, operator, sensor,
trigger, extra link and queue provider the installed package defines sits in a module (or,
for links and queues, at a class path) the provider info lists under its kind (so a module
added on another branch and not listed fails here, by name). Package walks and Airflow's
discovery run in a subprocess with a throwaway AIRFLOW_HOME, so this process's Airflow config
stays untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentpost.provider_info import get_provider_info

PROBE = """
import json, warnings
warnings.simplefilter("ignore")
from airflow.providers_manager import ProvidersManager
pm = ProvidersManager()
hook = pm.hooks.get("agentpost")
print(json.dumps({
    "provider": "airflow-agentpost" in pm.providers,
    "hook": hook.hook_class_name if hook else None,
    "triggers": sorted(t.trigger_class_name for t in pm.trigger
                       if t.package_name == "airflow-agentpost"),
    "queues": [q for q in pm.queue_class_names if q.startswith("agentpost.")],
    "config": sorted(pm.provider_configs and dict(pm.provider_configs).get(
        "airflow-agentpost", {}).get("agentpost", {}).get("options", {})),
}))
"""

# Finds every class of the provider's kinds defined (not re-exported) in a module of the
# installed packages, and every module that does not import.
WALK = """
import importlib, inspect, json, pkgutil, warnings
warnings.simplefilter("ignore")
from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator
from airflow.triggers.base import BaseTrigger

KINDS = [("sensors", BaseSensorOperator), ("operators", BaseOperator),
         ("triggers", BaseTrigger), ("hooks", BaseHook), ("extra-links", BaseOperatorLink)]
try:  # common-messaging's queue providers (the ai extra)
    from airflow.providers.common.messaging.providers.base_provider import (
        BaseMessageQueueProvider)
    KINDS.append(("queues", BaseMessageQueueProvider))
except ImportError:
    pass
found, broken, modules = [], {}, set()
for root in ("agentpost", "agentpost.operators"):
    package = importlib.import_module(root)
    modules.add(root)
    modules.update(m.name for m in pkgutil.walk_packages(package.__path__, root + "."))
for name in sorted(modules):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        broken[name] = f"{type(exc).__name__}: {exc}"
        continue
    for cls in vars(module).values():
        if not inspect.isclass(cls) or cls.__module__ != name:
            continue
        kind = next((k for k, base in KINDS if issubclass(cls, base)), None)
        if kind is not None:
            found.append({"kind": kind, "module": name, "class": cls.__qualname__})
print(json.dumps({"found": found, "broken": broken, "modules": sorted(modules)}))
"""

MODULE_KINDS = ("hooks", "operators", "sensors", "triggers")
#: kinds the provider info lists by class path, not by module
CLASS_KINDS = ("extra-links", "queues")


def run_probe(script: str, home: Path) -> Any:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def listed(info: dict[str, Any], kind: str) -> list[str]:
    return [m for entry in info.get(kind, []) for m in entry["python-modules"]]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_probe(WALK, tmp_path_factory.mktemp("airflow-home"))


def test_provider_info_names_importable_modules() -> None:
    import importlib

    info = get_provider_info()
    for group in MODULE_KINDS:
        for module in listed(info, group):
            importlib.import_module(module)
    [conn] = info["connection-types"]
    module, _, cls = conn["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), cls)
    assert hook.conn_type == conn["connection-type"] == "agentpost"
    assert hook.default_conn_name == conn["default-conn-name"] == "agentpost_default"


def test_provider_info_is_valid_for_airflow() -> None:
    """Airflow validates provider info against its schema when it loads providers."""
    import importlib.resources

    import jsonschema

    schema = json.loads(importlib.resources.files("airflow").joinpath(
        "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    [version] = info["versions"]
    from importlib.metadata import version as installed

    assert version == installed("airflow-agentpost")
    docs = Path(__file__).resolve().parents[2]
    for guide in info["integrations"][0]["how-to-guide"]:
        assert (docs / guide.lstrip("/")).is_file(), guide


def test_every_module_of_the_package_imports(walk: dict[str, Any]) -> None:
    assert "agentpost.hooks.agentpost" in walk["modules"]
    assert "agentpost.operators.inbox" in walk["modules"]
    assert walk["broken"] == {}


def test_every_provider_class_is_listed(walk: dict[str, Any]) -> None:
    """The merge check: a hook, operator, sensor, trigger or extra link whose module (class
    path, for links) the provider info does not list fails here, with what to add."""
    info = get_provider_info()
    missing = []
    for item in walk["found"]:
        kind, module = item["kind"], item["module"]
        if kind in CLASS_KINDS:
            if f"{module}.{item['class']}" not in info[kind]:
                missing.append(f'"{kind}": {module}.{item["class"]}')
        elif module not in listed(info, kind):
            missing.append(f'"{kind}": {module} (defines {item["class"]})')
    assert not missing, ("add to agentpost/provider_info.py:\n  " + "\n  ".join(missing))
    kinds = {item["kind"] for item in walk["found"]}
    assert {"hooks", "operators", "sensors", "triggers", "queues"} <= kinds, (
        "the walk found nothing")


def test_no_listed_module_is_stale(walk: dict[str, Any]) -> None:
    """Every listed module defines something of its kind (a module emptied by a refactor, or
    a package that only re-exports, is listed by its defining modules instead)."""
    info = get_provider_info()
    defines = {(item["kind"], item["module"]) for item in walk["found"]}
    stale = [f'"{kind}": {module}' for kind in MODULE_KINDS for module in listed(info, kind)
             if (kind, module) not in defines]
    for kind in CLASS_KINDS:
        classes = {f"{i['module']}.{i['class']}" for i in walk["found"] if i["kind"] == kind}
        stale += [f'"{kind}": {path}' for path in info[kind] if path not in classes]
    assert not stale, "listed but defining nothing of that kind:\n  " + "\n  ".join(stale)


def test_airflow_discovers_the_provider(tmp_path: Path) -> None:
    found = run_probe(PROBE, tmp_path)
    assert found == {"provider": True, "hook": "agentpost.hooks.AgentpostHook",
                     "triggers": sorted(listed(get_provider_info(), "triggers")),
                     "queues": sorted(get_provider_info()["queues"]),
                     # the [agentpost] settings, as `airflow config list` shows them
                     "config": sorted(get_provider_info()["config"]["agentpost"]["options"])}
    assert {"metrics_token", "metrics_inboxes", "mcp_space"} <= set(found["config"])
    assert found["queues"], "no queue provider discovered"
    assert found["triggers"], "no trigger module discovered"
