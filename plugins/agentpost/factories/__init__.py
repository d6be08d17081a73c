"""DAG factories: DAGs built from declarations instead of written by hand.

- `agentpost.factories.routes`: an Asya route as a DAG, each actor a task mapped over its hops;
- `agentpost.factories.fleet`: one DAG per agent manifest of a fleet file (source agents on
  their interval, reactive agents on their inbox);
- `agentpost.factories.reactive`: an event-driven agent DAG, run by envelope arrivals
  (an asset watcher on `InboxEventTrigger`);
- `agentpost.factories.boundary`: resolution boundaries of deferred mark scopes;
- `agentpost.factories.maintenance`: the store's housekeeping and signed trail checkpoints.

Each module is imported on its own; nothing here touches the store while a DAG file is parsed:
only the tasks open it.
"""
