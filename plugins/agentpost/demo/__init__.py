"""The demos: the terminal demo (`terminal`, `agentpost demo`) and every example of dags/ on a
real Airflow or under `dag.test()` (`airflow`, `agentpost demo --airflow|--headless`, with
`child`, the headless demo's `dag.test()` process), the scenarios both Airflow demos play
(`scenarios`), and the demos' databases and the store a running `make demo` publishes
(`store`).

Kept empty of imports: the headless demo's child starts as ``python -m
agentpost.demo.child`` and the CLI finds a running demo's store without loading the demos.
"""
