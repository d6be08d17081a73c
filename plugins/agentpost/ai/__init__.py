"""agentpost.ai: the agent tools (agentpost.tools) as an Airflow common-ai toolset.

Needs the ``ai`` extra (``pip install 'airflow-agentpost[ai]'``). See docs/agents.md.
"""

try:
    import pydantic_ai  # noqa: F401
    from airflow.providers.common.ai.utils.toolset_base import AirflowToolset  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test with the import blocked
    raise ImportError(
        "agentpost.ai needs Airflow's common-ai provider and pydantic-ai: "
        "pip install 'airflow-agentpost[ai]'") from exc

from agentpost.ai.toolset import AgentpostToolset, GuardedToolset, run_info

__all__ = ["AgentpostToolset", "GuardedToolset", "run_info"]
