"""DAG factories: functions that build agentpost DAGs (agents, boundaries) from a few
arguments."""
