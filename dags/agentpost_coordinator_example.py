"""A coordinator and two workers: the coordinator directs both (a mapped DirectiveOperator),
worker-a asks a question (QueryOperator, in reply to its directive), the coordinator leases
its inbox and answers each question with feedback (mapped over the leases, then acks them),
and each worker consumes its inbox with the ``@agentpost_task.consume`` decorator."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag, task

from agentpost.operators import (
    AckOperator,
    DirectiveOperator,
    FeedbackOperator,
    LeaseOperator,
    QueryOperator,
    TopologyOperator,
    agentpost_task,
)

BOSS, WORKERS = "coordinator-1", ("worker-a", "worker-b")


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     tags=["agentpost", "example"])
def agentpost_coordinator_example():
    setup = TopologyOperator(task_id="setup", workspaces=[
        (BOSS, "coordinator"), *((w, "worker", BOSS) for w in WORKERS)])

    direct = DirectiveOperator.partial(task_id="direct", sender=BOSS).expand_kwargs([
        {"to": "worker-a", "content": "Find flights to Lisbon"},
        {"to": "worker-b", "content": "Find hotels in Lisbon"},
    ])
    ask = QueryOperator(task_id="ask", sender="worker-a", to=BOSS,
                        content="Which dates?",
                        in_reply_to="{{ ti.xcom_pull(task_ids='direct', map_indexes=0) }}")
    questions = LeaseOperator(task_id="lease_questions", workspace_id=BOSS, max=10, ttl=600)

    @task
    def reply_to(lease: dict) -> dict:
        """The feedback answering one leased query."""
        return {"to": lease["envelope"]["from"], "in_reply_to": lease["envelope_id"],
                "content": "21-24 November"}

    answer = FeedbackOperator.partial(task_id="answer", sender=BOSS).expand_kwargs(
        reply_to.expand(lease=questions.output))
    done = AckOperator.partial(task_id="ack_question").expand(lease=questions.output)

    def work(envelope) -> str:
        """A worker's handler: called once per leased envelope; returning acks it."""
        return f"{envelope.type}: {envelope.content}"

    setup >> direct >> ask >> questions
    for worker in WORKERS:
        consume = agentpost_task.consume(task_id=f"work_{worker.removeprefix('worker-')}",
                                         workspace_id=worker, max=10)
        [answer, done] >> consume(work)()


agentpost_coordinator_example()
