"""Configuration from the environment, in one place.

| variable | meaning | default |
|---|---|---|
| AGENTPOST_DSN | Postgres DSN of the store | none (discovery finds one for demo and tests) |
| AGENTPOST_TRAIL_KEY | HMAC key that signs the trail | a development key, with a warning |
| AGENTPOST_ACK_TIMEOUT | base acknowledgment timeout in seconds (WACP §7.1) | 2.0 |
| AGENTPOST_MAX_CONTENT_BYTES | largest payload accepted | 1048576 |
| AGENTPOST_MAX_MARK_CONTENT_BYTES | largest content of one mark (JSON bytes) | 65536 |
| AGENTPOST_DURABLE_ACKS | commit acks and nacks synchronously (1) or not (0) | 0 |

Acks and nacks commit asynchronously by default: a server crash can lose the last few
hundred milliseconds of them, and what was lost is delivered again, which at-least-once
delivery allows. Leases and heartbeats always commit durably, because losing one could hand
an envelope to a second consumer while the first still works on it.
"""

from __future__ import annotations

import os
import warnings

from pydantic import BaseModel, ConfigDict, Field

from agentpost.protocol.errors import ConfigurationError
from agentpost.protocol.validation import DEFAULT_MAX_CONTENT_BYTES

#: the largest content of one mark (AGENTPOST_MAX_MARK_CONTENT_BYTES)
DEFAULT_MAX_MARK_CONTENT_BYTES = 64 << 10

#: used only when no key is configured; anyone can forge entries signed with it
DEVELOPMENT_TRAIL_KEY = "agentpost-development-key-not-secret"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    dsn: str | None = None
    trail_key: str = DEVELOPMENT_TRAIL_KEY
    ack_timeout: float = Field(default=2.0, gt=0, le=3600)
    max_content_bytes: int = Field(default=DEFAULT_MAX_CONTENT_BYTES, gt=0, le=256 << 20)
    max_mark_content_bytes: int = Field(default=DEFAULT_MAX_MARK_CONTENT_BYTES, gt=0,
                                        le=256 << 20)
    durable_acks: bool = False

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env = os.environ
        values: dict[str, object] = {}
        if env.get("AGENTPOST_DSN"):
            values["dsn"] = env["AGENTPOST_DSN"]
        if env.get("AGENTPOST_TRAIL_KEY"):
            values["trail_key"] = env["AGENTPOST_TRAIL_KEY"]
        if env.get("AGENTPOST_ACK_TIMEOUT"):
            values["ack_timeout"] = env["AGENTPOST_ACK_TIMEOUT"]
        if env.get("AGENTPOST_MAX_CONTENT_BYTES"):
            values["max_content_bytes"] = env["AGENTPOST_MAX_CONTENT_BYTES"]
        if env.get("AGENTPOST_MAX_MARK_CONTENT_BYTES"):
            values["max_mark_content_bytes"] = env["AGENTPOST_MAX_MARK_CONTENT_BYTES"]
        if env.get("AGENTPOST_DURABLE_ACKS"):
            values["durable_acks"] = env["AGENTPOST_DURABLE_ACKS"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls(**values)
        except ValueError as exc:
            raise ConfigurationError(f"bad agentpost configuration: {exc}") from None
        if settings.trail_key == DEVELOPMENT_TRAIL_KEY:
            _warn_development_key()
        return settings

    def require_dsn(self) -> str:
        if not self.dsn:
            raise ConfigurationError("no store configured: set AGENTPOST_DSN")
        return self.dsn


_warned: list[bool] = []


def _warn_development_key() -> None:
    """Warn once per process: every store, hook and task builds its settings, and one line
    says it all (Python's own once-per-location filter would repeat it per caller)."""
    if _warned:
        return
    _warned.append(True)
    warnings.warn("AGENTPOST_TRAIL_KEY is not set: the trail is signed with the public "
                  "development key", stacklevel=3)


def mark_content_limit(value: object = None) -> int:
    """The bound on one mark's content for a mark space: ``value`` if given, else
    AGENTPOST_MAX_MARK_CONTENT_BYTES, else the default. Checked like every setting (a
    positive number of bytes, at most 256 MiB); ConfigurationError otherwise. Reads only
    this variable, so building a mark space never warns about the trail key."""
    if value is None:
        value = os.environ.get("AGENTPOST_MAX_MARK_CONTENT_BYTES") or None
    try:
        settings = Settings() if value is None else Settings(max_mark_content_bytes=value)
    except ValueError as exc:
        raise ConfigurationError(f"bad agentpost configuration: {exc}") from None
    return settings.max_mark_content_bytes
