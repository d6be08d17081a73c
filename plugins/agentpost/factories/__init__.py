"""DAG factories: DAGs built from declarations instead of written by hand.

- `agentpost.factories.fleet`: one DAG per agent manifest of a fleet file (source agents on
  their interval, reactive agents on their inbox);
- `agentpost.factories.boundary`: resolution boundaries of deferred mark scopes;
- `agentpost.factories.maintenance`: the store's housekeeping and signed trail checkpoints.

Nothing here touches the store while a DAG file is parsed: only the tasks open it.
"""
