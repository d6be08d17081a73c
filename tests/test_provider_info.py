"""The distribution registers itself as an Airflow provider: Airflow finds the `agentpost`
connection type, its hook, the operator module and the trigger modules through the entry
point (checked in a subprocess with a throwaway AIRFLOW_HOME, so this process's Airflow config
stays untouched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
}))
"""


def test_provider_info_names_importable_modules() -> None:
    import importlib

    info = get_provider_info()
    for group in ("hooks", "sensors", "operators", "triggers"):
        for entry in info[group]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    [conn] = info["connection-types"]
    module, _, cls = conn["hook-class-name"].rpartition(".")
    assert getattr(importlib.import_module(module), cls).conn_type == conn["connection-type"]


def test_airflow_discovers_the_provider(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"provider": True, "hook": "agentpost.hooks.AgentpostHook",
                     "triggers": ["agentpost.command_triggers", "agentpost.triggers"]}
