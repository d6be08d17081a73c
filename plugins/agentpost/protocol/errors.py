"""Typed errors. Every failure that crosses the public API is one of these, with a message
meant for a person; database errors never leak through."""


class AgentpostError(Exception):
    """Base of every error agentpost raises on purpose."""


class InvalidInput(AgentpostError, ValueError):
    """The caller passed something malformed that cannot even be recorded as a rejection."""


class InvalidAnchor(InvalidInput):
    """A trail checkpoint that is malformed, or whose signature does not verify with the trail
    key: it anchors nothing, so verifying against it cannot pass."""


class NotFound(AgentpostError, LookupError):
    """An unknown workspace, role, envelope or port right."""


class Conflict(AgentpostError):
    """The request contradicts the current state (already exists, already consumed, ...)."""


class InvalidTransition(Conflict):
    """A workspace state change that the state machine does not allow."""


class InboxBlocked(Conflict):
    """A blocking envelope holds the inbox: it must be consumed first."""


class LeaseLost(Conflict):
    """The lease token is stale: the lease expired, or the envelope was leased again since.
    Nothing changed; the envelope will be (or was) delivered again."""


class Forbidden(AgentpostError, PermissionError):
    """The acting workspace may not do this (e.g. revoke a right without being a coordinator)."""


class ConfigurationError(AgentpostError):
    """agentpost is not configured well enough to do this (e.g. no trail key)."""


class StoreError(AgentpostError):
    """The store failed in a way the caller cannot fix by changing the request."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached."""


class InvalidRoute(InvalidInput):
    """A malformed route: no actors, a bad actor name, an end actor in the route, a bad index."""


class UnknownActor(InvalidRoute):
    """The route names an actor that is not known (has no inbox)."""


class RouteRewrite(InvalidRoute):
    """A revised route that does not start with the part already travelled."""


class RouteEnded(Conflict):
    """The envelope is at an end actor: end actors never advance it."""


def one_line(exc: BaseException) -> str:
    """An error's message on one line (its lines joined by "; "), as the CLI and the demos
    print it: a multi-line message (a fleet file's problems) stays one line of stderr."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
