"""`agentpost demo`: the terminal demo (`agentpost.demo.terminal`), or every example DAG on
a real Airflow or under dag.test() (`agentpost.demo.airflow`). Both are imported only when a
demo runs: they bring the store, and the Airflow demos Airflow itself."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.protocol.errors import InvalidInput


def cmd_demo(args: argparse.Namespace) -> int:
    if args.airflow:
        from agentpost.demo.airflow import run_airflow_demo

        return run_airflow_demo(dsn=args.dsn, dags_folder=args.dags_folder)
    if args.headless:
        from agentpost.demo.airflow import run_headless_demo

        return run_headless_demo(dsn=args.dsn, dags_folder=args.dags_folder)
    if args.dags_folder is not None:
        raise InvalidInput("--dags-folder is for the Airflow demos (--airflow, --headless); "
                           "the terminal demo plays no DAGs")
    from agentpost.demo.terminal import run_demo

    return run_demo(dsn=args.dsn)


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run a demo: in the terminal (default), on a real "
                                       "Airflow, or under dag.test()")
    mode = demo.add_mutually_exclusive_group()
    mode.add_argument("--airflow", action="store_true",
                      help="run the example DAGs on `airflow standalone` until Ctrl-C")
    mode.add_argument("--headless", action="store_true",
                      help="run the example DAGs with dag.test(), no servers")
    demo.add_argument("--dags-folder", metavar="DIR",
                      help="the DAGs and fleet.yaml the Airflow demos play (default: dags/ "
                           "of the agentpost checkout this runs in)")
    demo.set_defaults(func=cmd_demo)
