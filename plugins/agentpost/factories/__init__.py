"""DAG factories: functions that build whole DAGs for agentpost's patterns (routes, fleets,
boundaries, ...). Each module is imported on its own; nothing here touches the store at
parse time."""
