"""The files a Run's sandboxed skills wrote and that were kept (seed 004 §4.3): listed and downloaded by
whoever may read the Run — its tenant; another tenant's Run is a 404, as everywhere in the API."""

from __future__ import annotations

import urllib.parse
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Security
from fastapi.responses import Response

from harness.domain.contracts import ArtifactFile
from harness.pipeline.artifacts import files_of, find_file, skipped_files_of, stored_bytes
from harness.service.auth import Principal, principal
from harness.service.bodies import HEX64
from harness.service.core import Service
from harness.service.errors import ApiError
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import FileDoc, FileList, SkippedFileDoc
from harness.service.views import API
from harness.wiring.retention import segment_locator

router = APIRouter(prefix="/api/v1", tags=["runs"])
Caller = Annotated[Principal, Security(principal)]
Sha256 = Annotated[str, Path(pattern=HEX64, description="The SHA-256 of the file's bytes, as its listing gives it.")]
DOWNLOAD: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}},
          "description": "The file's bytes, as an attachment named after it, with its media type."},
}


def _doc(run_id: str, file: ArtifactFile) -> FileDoc:
    return FileDoc(**file.model_dump(), url=f"{API}/runs/{run_id}/files/{file.sha256}")


@router.get("/runs/{run_id}/files", response_model=FileList, responses=errors(404, 410),
            summary="List the files a Run's skills wrote")
def list_files(run_id: str, caller: Caller, svc: Service = ServiceDep) -> FileList:
    """The files the Run's sandboxed skills wrote in its working directory and that were kept (name, size,
    media type, SHA-256, the step that wrote it), each with its download URL; and those that were not
    kept, with the reason (over the size or count bound, not a plain file)."""
    run = svc.owned_run(caller, run_id)
    return FileList(files=[_doc(run_id, f) for f in files_of(run.context)],
                    skipped=[SkippedFileDoc(**s.model_dump()) for s in skipped_files_of(run.context)])


@router.get("/runs/{run_id}/files/{sha256}", response_class=Response, responses={**DOWNLOAD, **errors(404, 410)},
            summary="Download a file a Run's skill wrote")
def download_file(run_id: str, sha256: Sha256, caller: Caller, svc: Service = ServiceDep) -> Response:
    """The bytes of one of the Run's kept files, checked against its SHA-256 before they are sent. Always
    an attachment, never shown inline: a file a skill wrote is not a page of this site. 404 when the Run
    kept no such file, or its content was erased."""
    run = svc.owned_run(caller, run_id)
    file = find_file(run.context, sha256)
    if file is None:
        raise ApiError(404, "not_found", f"run {run_id!r} kept no file with SHA-256 {sha256}")
    data = stored_bytes(svc.ops.contents, file, segment_locator())
    if data is None:
        raise ApiError(404, "not_found", f"the content of {file.name!r} is no longer stored (erased) or does "
                                         "not match its hash")
    filename = PurePosixPath(file.name).name
    disposition = f"attachment; filename*=UTF-8''{urllib.parse.quote(filename, safe='')}"
    return Response(data, media_type=file.media_type, headers={
        "Content-Disposition": disposition, "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'", "ETag": f'"{file.sha256}"'})
