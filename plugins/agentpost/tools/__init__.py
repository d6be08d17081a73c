"""agentpost.tools: the agent tools, defined once (docs/agents.md).

Plain Python above the store, the marks and SMCL, below every adapter: `AgentTools` is one
seat (a workspace and a mark-space agent, fixed by whoever runs it) with one method per tool;
`TOOLS` lists the tools (name, description, argument model) for adapters to expose, the
Airflow toolset (`agentpost.ai`) and the MCP server (`agentpost.mcpserver`). Every refusal is a
`ToolRefused` with its reason, and nothing is written.
"""

from agentpost.tools.agent import TOOLS, AgentTools, ToolRefused, ToolSpec, refusals
from agentpost.tools.models import RunInfo

__all__ = ["TOOLS", "AgentTools", "RunInfo", "ToolRefused", "ToolSpec", "refusals"]
