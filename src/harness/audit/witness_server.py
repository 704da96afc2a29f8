"""A checkpoint witness over HTTP (SPEC A3b): `harness witness serve --dir FOLDER`.

It keeps the checkpoints publishers give it in a WitnessLog (harness.audit.witness): per database,
append-only, each accepted only when signed by the key it trusts for that database and consistent with
the newest one it holds. Run it on another machine, under another account, than the databases it
witnesses: a local attacker there can neither rewrite nor re-sign what it keeps.

    GET  /v1/{database_id}/checkpoints         every checkpoint kept, oldest first
    GET  /v1/{database_id}/checkpoints/latest  the newest one (404: none)
    GET  /v1/{database_id}/public-key          the key it pinned (PEM; 404: none)
    POST /v1/{database_id}/checkpoints         {"checkpoint", "public_key", "consistency"}
                                               201 kept, 200 held already, 409 stale or inconsistent,
                                               403 not signed by the trusted key, 422 malformed
    GET  /health

With a token (HARNESS_WITNESS_TOKEN or --token-env) a POST needs `Authorization: Bearer <token>`; reads
are open, as checkpoints are public.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from harness.audit.checkpoint_files import public_pem
from harness.audit.keys import CheckpointError
from harness.audit.witness import WitnessLog, WitnessRefusedError


class Submission(BaseModel):
    """A checkpoint offered to the witness."""

    model_config = ConfigDict(extra="forbid")
    checkpoint: dict[str, Any]
    public_key: str | None = None
    consistency: dict[str, Any] | None = None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"status": status, "message": message}}, status_code=status)


def create_witness_app(root: Path, token: str | None = None) -> FastAPI:
    """The witness's ASGI app, keeping its checkpoints under `root`."""
    log = WitnessLog(root)
    app = FastAPI(title="harness checkpoint witness", version="1")

    def guarded(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except WitnessRefusedError as exc:
            return _error(exc.status, str(exc))
        except CheckpointError as exc:
            return _error(500, f"the witness cannot read its own store: {exc}")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/{database_id}/checkpoints")
    def checkpoints(database_id: str) -> Any:
        found = guarded(log.checkpoints, database_id)
        return found if isinstance(found, JSONResponse) else {"checkpoints": found}

    @app.get("/v1/{database_id}/checkpoints/latest")
    def latest(database_id: str) -> Any:
        found = guarded(log.latest, database_id)
        return _error(404, f"no checkpoint of database {database_id}") if found is None else found

    @app.get("/v1/{database_id}/public-key")
    def public_key(database_id: str) -> Any:
        found = guarded(log.public_key, database_id)
        if isinstance(found, JSONResponse):
            return found
        if found is None:
            return _error(404, f"no key pinned for database {database_id}")
        return Response(public_pem(found), media_type="application/x-pem-file")

    @app.post("/v1/{database_id}/checkpoints")
    async def submit(database_id: str, body: Submission, request: Request) -> Any:
        if token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _error(401, "a submission needs the witness's bearer token")
        # the log writes files and takes a file lock: off the event loop
        receipt = await run_in_threadpool(guarded, log.submit, database_id, body.checkpoint, body.public_key,
                                          body.consistency)
        if isinstance(receipt, JSONResponse):
            return receipt
        return JSONResponse({"serial": receipt.serial, "duplicate": receipt.duplicate},
                            status_code=200 if receipt.duplicate else 201)

    return app
