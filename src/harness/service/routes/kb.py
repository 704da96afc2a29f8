"""Knowledge bases over HTTP: the caller's tenant's documents, added, listed and removed.

Every request is authenticated and confined to the caller's tenant (another tenant's document is a 404, as
if it did not exist). Reading the list needs no role; adding and removing change what every Run of the
tenant may be given, so they need the operator or knowledge_editor role.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query, Security
from pydantic import BaseModel, Field

from harness.domain.errors import UnknownDocumentError
from harness.knowledge.base import DEFAULT_KB, NAME, Added, Document, KnowledgeBase
from harness.service import views
from harness.service.auth import Principal, principal
from harness.service.core import Service
from harness.service.errors import ApiError, not_found
from harness.service.routes.common import ServiceDep, errors

router = APIRouter(prefix="/api/v1/kb", tags=["knowledge bases"])
Caller = Annotated[Principal, Security(principal)]
#: roles that may add and remove a tenant's documents
EDITOR_ROLES = frozenset({"operator", "knowledge_editor"})
Name = Annotated[str, Field(pattern=NAME.pattern)]


class DocumentIn(BaseModel):
    """A file to add: its name (the suffix says its kind: .md, .txt or .pdf) and its content, as text or as
    base64 (a PDF)."""

    name: str = Field(min_length=1, max_length=256, description="The file's name, e.g. refunds.md.")
    text: str | None = Field(default=None, max_length=5_000_000, description="The content of a text file.")
    content_base64: str | None = Field(default=None, max_length=7_000_000,
                                       description="The content, base64-encoded (for a PDF).")
    kb: Name = Field(default=DEFAULT_KB, description="The knowledge base (an agent names those it reads).")
    tags: list[Name] = Field(default_factory=list, max_length=16)
    agent: Name | None = Field(default=None, description="Only this agent may read it.")
    team: Name | None = Field(default=None, description="Only this team's Runs may read it.")


class DocumentDoc(BaseModel):
    """A stored document of the caller's tenant."""

    document_id: str
    kb: str
    agent: str | None
    team_id: str | None
    title: str
    media_type: str
    tags: list[str]
    content_hash: str
    chunks: int
    chars: int
    filtered_secrets: int
    created_at: dt.datetime


class AddedDoc(DocumentDoc):
    """A document as `add` left it: `stored` is false when the same file was already there."""

    stored: bool


class DocumentList(BaseModel):
    """The caller's tenant's documents, oldest first."""

    documents: list[DocumentDoc]


class RemovedDoc(BaseModel):
    """A removed document and how many chunks went with it."""

    document_id: str
    chunks_removed: int


def _knowledge(svc: Service) -> KnowledgeBase:
    knowledge = svc.ops.knowledge
    if knowledge is None:
        raise ApiError(503, "unavailable", "this runtime has no knowledge base")
    return knowledge


def _editor(caller: Principal) -> None:
    if not caller.has_any(EDITOR_ROLES):
        raise ApiError(403, "forbidden", f"this needs one of the roles {sorted(EDITOR_ROLES)}")


def document_doc(d: Document) -> dict[str, object]:
    """A document as the API shows it (without its tenant: always the caller's)."""
    doc = d.to_dict()
    doc.pop("tenant_id")
    return {**doc, "created_at": views.when(d.created_at)}


@router.get("/documents", response_model=DocumentList, responses=errors(503), summary="List knowledge-base documents")
def list_documents(
    caller: Caller,
    svc: Service = ServiceDep,
    kb: Annotated[str | None, Query(pattern=NAME.pattern, description="Only this knowledge base's.")] = None,
    tag: Annotated[str | None, Query(pattern=NAME.pattern, description="Only documents with this tag.")] = None,
) -> DocumentList:
    """The documents of the caller's tenant, oldest first, with how each was cut and filtered."""
    found = _knowledge(svc).documents(caller.tenant_id, kb, tag)
    return DocumentList.model_validate({"documents": [document_doc(d) for d in found]})


@router.post("/documents", response_model=AddedDoc, status_code=201, responses=errors(403, 503),
             summary="Add a document to a knowledge base")
def add_document(body: DocumentIn, caller: Caller, svc: Service = ServiceDep) -> AddedDoc:
    """Add a Markdown, plain-text or PDF file to one of the caller's tenant's knowledge bases: its text is
    filtered for secrets and cut into chunks. An empty or unreadable file, or one of another kind, is a 422
    naming it. The same file added again is not stored twice (`stored: false`). Needs the operator or
    knowledge_editor role."""
    _editor(caller)
    if (body.text is None) == (body.content_base64 is None):
        raise ApiError(422, "invalid_request", "give the content as exactly one of text and content_base64")
    try:
        data = body.text.encode("utf-8") if body.text is not None else base64.b64decode(
            body.content_base64 or "", validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "invalid_request", "content_base64: not valid base64") from None
    added: Added = _knowledge(svc).add_bytes(body.name, data, tenant_id=caller.tenant_id, kb=body.kb,
                                             tags=body.tags, agent=body.agent, team_id=body.team)
    return AddedDoc.model_validate({**document_doc(added.document), "stored": added.stored})


@router.delete("/documents/{document_id}", response_model=RemovedDoc, responses=errors(403, 404, 503),
               summary="Remove a knowledge-base document")
def remove_document(document_id: str, caller: Caller, svc: Service = ServiceDep) -> RemovedDoc:
    """Remove a document of the caller's tenant with its chunks (404 for an unknown id or another tenant's).
    Runs that were given its chunks keep naming them in their traces. Needs the operator or knowledge_editor
    role."""
    _editor(caller)
    try:
        removed = _knowledge(svc).remove(caller.tenant_id, document_id)
    except UnknownDocumentError:
        raise not_found("knowledge-base document", document_id) from None
    return RemovedDoc(document_id=document_id, chunks_removed=removed)
