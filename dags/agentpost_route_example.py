"""A three-actor route with fan-out: `split` breaks a sentence into words (a fan-out: one
envelope per word, so `shout` runs as one mapped task per word), `shout` upper-cases each,
`count` adds its length. Start it with ``{"payloads": [{"text": "..."}]}`` as the run's
conf, or with the default payload below.

Built by the route factory; the airflow DAG is the module-level `dag`."""

from __future__ import annotations

from agentpost.factories.routes import route_dag


def split(payload: dict) -> list[dict]:
    return [{"word": word} for word in payload["text"].split()]


def shout(payload: dict) -> dict:
    return {"word": payload["word"].upper()}


def count(payload: dict) -> dict:
    return {"length": len(payload["word"])}


dag = route_dag("agentpost_route_example",
                [("split", split), ("shout", shout), ("count", count)],
                payloads=[{"text": "route me please"}], tags=["agentpost", "example"])
