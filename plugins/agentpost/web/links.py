"""Operator extra links: from a task instance of an agentpost operator or sensor to its
envelope, command, mark or route page. (Filled in with the operators.)"""

from __future__ import annotations

EXTRA_LINKS: list[type] = []
