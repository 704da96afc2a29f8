"""`harness kb add|list|remove|search`: a tenant's knowledge bases from the command line.

Documents are Markdown, plain text or PDF files; secrets are removed from their text before anything is
stored. A Run's context gives the model the best-matching chunks of the knowledge bases its agent reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.support import DbOption, JsonOption, cli_errors, emit, identifier, screen

if TYPE_CHECKING:
    from harness.knowledge.base import KnowledgeBase

kb_app = typer.Typer(help="Knowledge bases: documents whose snippets a Run's context gives the model.",
                     no_args_is_help=True)

TenantOption = Annotated[str, typer.Option("--tenant", help="The tenant whose knowledge base it is.",
                                           callback=identifier("--tenant"))]
KbOption = Annotated[str, typer.Option("--kb", help="The knowledge base (an agent names those it reads).")]


def _knowledge(db: str | None) -> KnowledgeBase:
    """The knowledge bases of the database `db` names (imported here: `harness --help` loads none of it)."""
    from harness.settings import Settings
    from harness.stores import knowledge_base, open_store

    settings = Settings.from_env(db=db)
    return knowledge_base(open_store(settings.db), settings)


@kb_app.command("add")
@cli_errors
def add(
    paths: Annotated[list[Path], typer.Argument(help="Markdown (.md), plain text (.txt) or PDF (.pdf) files.")],
    tenant: TenantOption = "default",
    kb: KbOption = "default",
    tag: Annotated[list[str] | None, typer.Option("--tag", help="A label to list documents by (repeatable).")]
    = None,
    agent: Annotated[str | None, typer.Option("--agent-only", help="Only this agent may read the documents.")]
    = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's Runs may read the documents.")]
    = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Add files to a knowledge base: each is read, filtered for secrets and cut into chunks. A file that
    cannot be read, is empty or is of another kind stores none of them (exit 2); a file already there is not
    stored twice."""
    added = _knowledge(db).add_files(paths, tenant_id=tenant, kb=kb, tags=tag or (), agent=agent, team_id=team)
    if json_:
        emit({"documents": [a.to_dict() for a in added]})
        return
    for a in added:
        d = a.document
        what = f"added as {d.document_id}: {d.chunks} chunks" if a.stored else f"already there as {d.document_id}"
        secrets = f", {d.filtered_secrets} secrets removed" if a.stored and d.filtered_secrets else ""
        typer.echo(f"{d.title}: {what}{secrets} (tenant {d.tenant_id}, knowledge base {d.kb})")


@kb_app.command("list")
@cli_errors
def list_(
    tenant: TenantOption = "default",
    kb: Annotated[str | None, typer.Option("--kb", help="Only this knowledge base's documents.")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Only documents with this tag.")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """List a tenant's documents, oldest first."""
    documents = _knowledge(db).documents(tenant, kb, tag)
    if json_:
        emit({"tenant": tenant, "documents": [d.to_dict() for d in documents]})
        return
    from rich.table import Table

    table = Table("document", "knowledge base", "title", "type", "chunks", "tags", "only for")
    for d in documents:
        only = ", ".join(f"{k} {v}" for k, v in (("agent", d.agent), ("team", d.team_id)) if v)
        table.add_row(d.document_id, d.kb, d.title, d.media_type, str(d.chunks), ", ".join(d.tags), only)
    screen().print(table)


@kb_app.command("remove")
@cli_errors
def remove(
    document_id: Annotated[str, typer.Argument(help="The document's id (harness kb list).")],
    tenant: TenantOption = "default",
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Remove a document and its chunks from its knowledge base (exit 2 when the tenant has no such
    document). Runs that were given its chunks keep naming them in their traces."""
    chunks = _knowledge(db).remove(tenant, document_id)
    if json_:
        emit({"document_id": document_id, "tenant": tenant, "chunks_removed": chunks})
    else:
        typer.echo(f"removed {document_id} and its {chunks} chunks")


@kb_app.command("search")
@cli_errors
def search(
    query: Annotated[str, typer.Argument(help="What to look for, in plain words.")],
    tenant: TenantOption = "default",
    kb: Annotated[list[str] | None, typer.Option("--kb", help="A knowledge base to search (repeatable).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=50)] = 5,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Show the chunks a Run's context would be given for QUERY (documents of every agent and team only)."""
    from dataclasses import asdict

    from harness.knowledge.scope import KnowledgeScope

    found = _knowledge(db).search(KnowledgeScope(tenant, tuple(kb or ("default",))), query, limit)
    if json_:
        emit({"tenant": tenant, "query": query, "chunks": [{**asdict(s), "source": s.source} for s in found]})
        return
    for s in found:
        typer.echo(f"[{s.source}] {s.chunk_id} ({s.score:.3f})\n  {s.content[:300]}")
