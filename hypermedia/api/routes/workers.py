"""Routes of /v1/workers (being written)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
