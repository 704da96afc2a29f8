"""What the route modules share: documented error responses and the service dependency."""

from __future__ import annotations

from typing import Any

from fastapi import Depends

from harness.service.core import service_of
from harness.service.schemas import ErrorDoc

ServiceDep = Depends(service_of)


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the given error statuses (401 and 422 are always possible)."""
    described = {
        401: "Missing or invalid credentials.",
        403: "Not permitted for this identity.",
        404: "Unknown id (or another tenant's).",
        409: "Conflicts with the current state.",
        410: "The Run was archived and pruned: the body's `archived` says in which segment and where.",
        413: "The request body is larger than the service accepts.",
        422: "Malformed input, or a field over its limit.",
        503: "Unavailable: the database is down (`database_unavailable`, with Retry-After), or this service "
             "lacks what the route needs.",
    }
    return {code: {"model": ErrorDoc, "description": described[code]} for code in sorted({401, 422, *codes})}
