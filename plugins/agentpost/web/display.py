"""How the pages show values a person reads: times, durations, agents and states.

Times are rendered as ``<time datetime="<ISO UTC>" title="... UTC">`` holding a human UTC
time; agentpost.js rewrites the text into the viewer's zone and keeps UTC on hover, so a page
without JavaScript still reads a human time. Never an epoch number: the mark space keeps its
times as unix seconds, the store as timestamptz, the command views as ISO strings, and all
three come out the same here. The JSON API keeps its own formats (docs/ui.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

#: shown for a time or duration that is not there
NONE = "–"

#: a state's tone, for its badge's colour (agentpost.css ``.tone-*``): command states (SMCL),
#: saga states and step compensations, envelope statuses (WACP §5), route statuses (Asya)
TONES: Mapping[str, str] = {
    **dict.fromkeys(("executed", "completed", "succeeded", "won", "ok", "won, acted"), "ok"),
    **dict.fromkeys(("failed", "rejected", "escalated", "undeliverable", "lost", "declined"),
                    "bad"),
    **dict.fromkeys(("received", "canonicalized", "confirmation_required", "authz_pending",
                     "pending", "validated", "recorded"), "wait"),
    **dict.fromkeys(("confirmed", "authorized", "started", "running", "compensating",
                     "acknowledged"), "busy"),
    **dict.fromkeys(("compensated",), "undone"),
    **dict.fromkeys(("canceled", "not_needed", "none", "unknown", "no winner"), "quiet"),
}


def as_datetime(value: Any) -> datetime | None:
    """A time as an aware UTC datetime: from a datetime (naive ones are taken as UTC), an ISO
    8601 string, or unix seconds (the mark space's clock). None for anything else."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value:
        try:
            return as_datetime(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def iso_utc(value: Any) -> str:
    """The machine-readable form (``datetime`` attributes): ISO 8601 in UTC, milliseconds."""
    at = as_datetime(value)
    return "" if at is None else at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_text(value: Any, ms: bool = False) -> str:
    """A human UTC time, ``2026-11-27 09:39:12 UTC`` (with milliseconds if `ms`)."""
    at = as_datetime(value)
    if at is None:
        return NONE if value in (None, "") else str(value)
    return at.strftime("%Y-%m-%d %H:%M:%S") + (f".{at.microsecond // 1000:03d}" if ms else "") \
        + " UTC"


def when(value: Any, ms: bool = False) -> Markup | str:
    """A ``<time>`` element: the UTC time as text and title, localised by agentpost.js."""
    at = as_datetime(value)
    if at is None:
        return utc_text(value)
    extra = Markup(' data-ms="1"') if ms else Markup("")
    return Markup('<time datetime="{}" title="{}"{}>{}</time>').format(
        iso_utc(at), utc_text(at, ms=True), extra, utc_text(at, ms=ms))


def duration(seconds: Any) -> str:
    """Seconds as a person says them: ``45 s``, ``10 min``, ``2 h 30 min``, ``3 d``."""
    if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return NONE if seconds is None else str(seconds)
    left = round(float(seconds))
    if left < 60:
        return f"{float(seconds):g} s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def state_class(state: Any) -> str:
    """The badge classes of a state: ``chip tone-<tone> state-<state>``."""
    value = str(getattr(state, "value", state) or "")
    slug = "".join(c if c.isalnum() else "-" for c in value)
    return f"chip tone-{TONES.get(value, 'quiet')} state-{slug}"


def agent_tag(agent_id: Any, names: Mapping[str, str] | None = None) -> Markup:
    """An agent as a person reads it: its name when one is known (the id on hover), else its
    id, shortened, with the whole id on hover."""
    ident = str(agent_id or "")
    name = (names or {}).get(ident)
    if name:
        return Markup('<span class="agent" data-agent-id="{}" title="agent id {}">{}</span>'
                      ).format(ident, ident, name)
    short = ident[:8] + "…" if len(ident) > 12 else ident
    return Markup('<code class="agent unnamed" data-agent-id="{}" title="agent {} (no name '
                  'known to this store)">{}</code>').format(ident, ident, short)
