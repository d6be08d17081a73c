"""Who may look and who may act, by Airflow's own auth manager.

Every route of the page depends on `require_viewer` or `require_actor`; nothing is anonymous
(the gateway under ``/v1`` has its own capability tokens). The user comes from Airflow's
`get_user`: a bearer token, else the UI's session cookie, so the page works inside the UI's
iframe and from scripts alike.

- **Look**: the auth manager's custom view ``agentpost`` with method GET. Under the simple
  auth manager every role (viewer and up) has it; under FAB a role needs that resource.
- **Act** (the human highway): custom view ``agentpost`` with method POST *and* the right to
  change DAGs (`is_authorized_dag(method="PUT")`). An action moves work the DAGs run, so it
  takes what changing a DAG run takes: the simple auth manager's USER role and up; a viewer
  gets 403.
- **Cross-site forgery**: a request authenticated by the cookie must carry the form's
  `csrf_token` (or the ``X-CSRF-Token`` header), an HMAC of the user's id under the API's JWT
  secret, and an ``Origin`` naming this host when the browser sends one. A request that
  presents its own ``Authorization: Bearer`` header cannot be forged by another site and
  needs neither.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status

RESOURCE = "agentpost"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


def _auth_manager():
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


async def current_user(request: Request):
    """The Airflow user of this request: 401 without credentials, 401/403 on a bad token
    (Airflow's own `get_user`, so token expiry and revocation behave as in its API)."""
    from airflow.api_fastapi.core_api.security import get_user

    auth = request.headers.get("authorization")
    bearer = None
    if auth and auth.lower().startswith("bearer "):
        from fastapi.security import HTTPAuthorizationCredentials

        bearer = HTTPAuthorizationCredentials(scheme="Bearer", credentials=auth[7:].strip())
    return await get_user(request, None, bearer)


def can_view(user) -> bool:
    return bool(_auth_manager().is_authorized_custom_view(
        method="GET", resource_name=RESOURCE, user=user))


def can_act(user) -> bool:
    manager = _auth_manager()
    return bool(manager.is_authorized_custom_view(method="POST", resource_name=RESOURCE,
                                                  user=user)
                and manager.is_authorized_dag(method="PUT", user=user))


async def require_viewer(request: Request):
    user = await current_user(request)
    if not can_view(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "you may not view the agentpost page")
    request.state.agentpost_user = user
    return user


async def require_actor(request: Request):
    """An authorized, unforged state-changing request (see the module docstring)."""
    user = await require_viewer(request)
    if not can_act(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "your role may look at the agentpost page but not act on it")
    if not _has_bearer(request):
        _check_origin(request)
        sent = request.headers.get(CSRF_HEADER)
        if sent is None and _is_form(request):
            sent = (await request.form()).get(CSRF_FIELD)
        if not isinstance(sent, str) or not hmac.compare_digest(sent, csrf_token(user)):
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                "missing or wrong CSRF token: reload the page and try again")
    return user


def csrf_token(user) -> str:
    """The form token of this user: stable across the user's pages and API server workers
    sharing the JWT secret, useless to anyone else."""
    message = f"agentpost-csrf:{user.get_id()}".encode()
    return hmac.new(_secret(), message, hashlib.sha256).hexdigest()


def user_mac(user, message: str) -> str:
    """An HMAC of `message` for this user under the API's JWT secret (a value the page
    gives a user and checks when it comes back, like the CSRF token)."""
    return hmac.new(_secret(), f"{user.get_id()}:{message}".encode(),
                    hashlib.sha256).hexdigest()


def user_name(user) -> str:
    """The name recorded as the originator of a person's action."""
    return str(user.get_name() or user.get_id())


def _secret() -> bytes:
    """Airflow's own JWT secret, read (or, when unset, generated once per process) exactly as
    Airflow reads it, so the token agrees with the API server's other workers."""
    from airflow.api_fastapi.auth.tokens import get_signing_key

    return get_signing_key("api_auth", "jwt_secret").encode()


def _has_bearer(request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    return auth.lower().startswith("bearer ") and len(auth) > 7


def _is_form(request: Request) -> bool:
    kind = request.headers.get("content-type", "")
    return kind.startswith(("application/x-www-form-urlencoded", "multipart/form-data"))


def _check_origin(request: Request) -> None:
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return  # no header: not a browser's cross-site request; the token still decides
    host = urlsplit(origin).netloc
    if host != request.headers.get("host"):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "cross-site request refused (Origin is not this host)")


Viewer = Annotated[object, Depends(require_viewer)]
Actor = Annotated[object, Depends(require_actor)]
