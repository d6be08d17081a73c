"""The code of the example fleet's agents (dags/fleet.yaml names it as module:function).

Each function takes an `agentpost.factories.fleet.AgentContext` and returns what the
activation's XCom shows. The DAGs folder is on sys.path where DAGs are parsed and run, so
`agentpost_agents.parking:park` imports from here.
"""
