"""Managing on-insert rules (Courier §8). Rules are rows in Postgres; the store evaluates
them in the transaction that accepts an envelope (see sql/0005_leases.sql)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentpost.pg.db import Database
from agentpost.protocol.errors import NotFound
from agentpost.protocol.rules import Rule, parse_rule
from agentpost.store.checks import ref as _ref
from agentpost.store.queries import QUERIES


class RuleOps:
    """The rule half of EnvelopeStore (mixed in)."""

    db: Database

    def add_rule(self, rule: Mapping[str, Any] | Rule, *, replace: bool = False) -> Rule:
        """Store a rule (Courier §8.2's JSON form). Its notify types must be registered;
        an existing id is a conflict unless `replace`."""
        parsed = parse_rule(rule)
        self.db.scalar("SELECT agentpost.put_rule(%s, %s)",
                       (parsed.model_dump_json(by_alias=True), replace))
        return parsed

    def rules(self) -> list[Rule]:
        return [Rule.model_validate(r[0]) for r in self.db.fetchall(QUERIES["rules"])]

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules():
            if r.id == rule_id:
                return r
        raise NotFound(f"unknown rule {rule_id!r}")

    def remove_rule(self, rule_id: str) -> None:
        self.db.scalar("SELECT agentpost.remove_rule(%s)", (_ref(rule_id, "rule id"),))

    def enable_rule(self, rule_id: str, enabled: bool = True) -> Rule:
        self.db.scalar("SELECT agentpost.enable_rule(%s, %s)",
                       (_ref(rule_id, "rule id"), bool(enabled)))
        return self.rule(rule_id)

    def fire_rules(self) -> dict[str, Any]:
        """Send what rules have queued and not yet sent (after a crash; every send does this
        for its own firings)."""
        return self.db.scalar(QUERIES["fire_rules"], {"timeout_ms": self._timeout_ms})  # type: ignore[attr-defined]
