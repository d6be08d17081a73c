"""The analytics page(s)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from agentpost.web.auth import require_viewer

router = APIRouter(dependencies=[Depends(require_viewer)])
