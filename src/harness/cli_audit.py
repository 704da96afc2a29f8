"""`harness audit …`: verify, reconcile, checkpoint, rotate-key, export, drain (SPEC A3, A3b, A4, K8).

verify and reconcile exit 1 when they find a problem; a database refusing a checkpoint or an export
because its history no longer matches a signed checkpoint also exits 1. Bad input exits 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import sqlalchemy as sa
import typer
from rich.console import Console
from rich.table import Table

from harness.adapters.sql.database import resolve_url
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import (
    DIR_ENV,
    TamperedHistoryError,
    checkpoint_dir,
    json_dumps,
    latest_checkpoint,
    publish_checkpoint,
    rotate_key,
)
from harness.audit.export import export_run
from harness.audit.reconcile import ReconcileReport, reconcile
from harness.audit.verify import ChainReport, verify_chain
from harness.cli_support import EXIT_CHECK_FAILED, DbOption, JsonOption, cli_errors, emit, fail, open_store

P = ParamSpec("P")
R = TypeVar("R")

audit_app = typer.Typer(help="Verify and publish the tamper-evident audit trail.", no_args_is_help=True)

DirOption = Annotated[
    str | None,
    typer.Option("--dir", envvar=DIR_ENV, show_envvar=True,
                 help="Checkpoint directory (default ./harness-checkpoints)."),
]
LimitOption = Annotated[int, typer.Option("--limit", min=1, help="List at most this many problems.")]


def _audit_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Database failures are bad input (exit 2); a history that contradicts a checkpoint fails (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TamperedHistoryError as exc:
            fail(f"tampered history: {exc}", EXIT_CHECK_FAILED)
        except sa.exc.SQLAlchemyError as exc:
            fail(f"database error: {str(exc.orig) if hasattr(exc, 'orig') else exc}")

    return wrapper


def _open(db: str | None) -> SqlStore:
    """The store, refusing to create a new SQLite file: auditing a database that is not there is a mistake."""
    url = sa.engine.make_url(resolve_url(db))
    path = url.database if url.get_backend_name() == "sqlite" else None
    if path not in (None, "", ":memory:") and not Path(str(path)).is_file():
        fail(f"no database at {path}")
    return open_store(db)


def _print_verify(report: ChainReport) -> None:
    console = Console()
    verdict = "[green]OK[/]" if report.ok else f"[red]FAILED[/] ({report.problem_count} problem(s))"
    console.print(f"audit chain: {verdict}  {report.records_checked} records, "
                  f"head seq {report.chain_head.get('seq')}, {report.checkpoints_checked} checkpoint(s), "
                  f"outbox backlog {report.outbox_backlog}")
    if report.first_bad:
        bad = report.first_bad
        console.print(f"first bad: [bold]{bad.kind}[/] seq={bad.seq} record={bad.record_id} "
                      f"run={bad.run_id}: {bad.detail}")
    if len(report.problems) > 1:
        table = Table("kind", "seq", "record", "run", "detail")
        for p in report.problems:
            table.add_row(p.kind, str(p.seq or ""), p.record_id or "", p.run_id or "", p.detail)
        console.print(table)


@audit_app.command("verify")
@cli_errors
@_audit_errors
def verify(
    db: DbOption = None,
    json_: JsonOption = False,
    checkpoint_dir_: Annotated[
        str | None, typer.Option("--checkpoint-dir", envvar=DIR_ENV, help="Also check these checkpoints.")
    ] = None,
    limit: LimitOption = 20,
) -> None:
    """Walk the hash chain, cross-check it with Runs and checkpoints; exit 1 naming the first bad record."""
    directory = checkpoint_dir(checkpoint_dir_)
    if checkpoint_dir_ and not directory.is_dir():
        fail(f"checkpoint directory {directory} does not exist")
    report = verify_chain(_open(db), directory if directory.is_dir() else None, limit=limit)
    if json_:
        emit(report.to_dict())
    else:
        _print_verify(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _print_reconcile(report: ReconcileReport) -> None:
    console = Console()
    console.print(f"reconcile: {'[green]OK[/]' if report.ok else '[red]MISMATCH[/]'}")
    table = Table("final state", "runs", "audit event", "events", "")
    for f in report.finals:
        table.add_row(f.state, str(f.runs), f.event, str(f.events), "ok" if f.ok else "MISMATCH")
    console.print(table)
    for name, count in report.counts.items():
        if count:
            console.print(f"{name}: {count} mismatch(es)")
    for m in report.mismatches:
        console.print(f"  {m.check}{f' {m.run_id}' if m.run_id else ''}: {m.detail}")


@audit_app.command("reconcile")
@cli_errors
@_audit_errors
def reconcile_cmd(db: DbOption = None, json_: JsonOption = False, limit: LimitOption = 20) -> None:
    """Check that final-state counts match their audit events, each Run agrees with its transitions and
    spend totals match the recorded costs."""
    report = reconcile(_open(db), limit=limit)
    if json_:
        emit(report.to_dict())
    else:
        _print_reconcile(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@audit_app.command("checkpoint")
@cli_errors
@_audit_errors
def checkpoint_cmd(db: DbOption = None, json_: JsonOption = False, dir_: DirOption = None) -> None:
    """Drain the outbox, then publish a signed Merkle tree head of the whole chain as a new file."""
    cp = publish_checkpoint(_open(db), checkpoint_dir(dir_))
    doc = {**cp.summary(), "path": str(cp.path), "previous": (cp.doc.get("previous") or {}).get("file")}
    if json_:
        emit(doc)
    else:
        Console().print(f"published {cp.path}: tree size {cp.tree_size}, root {cp.root_hash}")


@audit_app.command("rotate-key")
@cli_errors
@_audit_errors
def rotate_key_cmd(
    db: DbOption = None,
    json_: JsonOption = False,
    dir_: DirOption = None,
    new_key: Annotated[Path | None, typer.Option(
        "--new-key", help="The new Ed25519 private key (PEM, mode 0600). Default: generate one in place of "
                          "the directory's checkpoint-key.pem (not when HARNESS_CHECKPOINT_KEY is set).")] = None,
) -> None:
    """Change the checkpoint signing key: publish a checkpoint signed by the new key and endorsed by the
    current one, so verifiers who trust the first key trust the new one; the old key signs nothing more."""
    cp, key_path = rotate_key(_open(db), checkpoint_dir(dir_), new_key)
    endorsement = cp.doc["endorsement"]
    doc = {**cp.summary(), "path": str(cp.path), "endorsed_by": endorsement["by_key_id"],
           "key_file": str(key_path)}
    if json_:
        emit(doc)
    else:
        Console().print(f"published {cp.path}: signed by the new key {cp.doc['key_id'][:16]}…, endorsed by "
                        f"{endorsement['by_key_id'][:16]}…; the new private key is {key_path}")


def _write_export(doc: dict[str, Any], output: Path, json_: bool) -> None:
    output.write_text(json_dumps(doc) + "\n", encoding="utf-8")
    summary = {"file": str(output), "run_id": doc["run_id"], "records": len(doc["records"]),
               "not_covered": len(doc["not_covered"]), "complete": doc["complete"],
               "checkpoint": doc["checkpoint"]["file"]}
    if json_:
        emit(summary)
    else:
        Console().print(f"wrote {output}: {summary['records']} record(s) proven in {summary['checkpoint']}")


@audit_app.command("export")
@cli_errors
@_audit_errors
def export_cmd(
    run_id: Annotated[str, typer.Argument(help="The Run to export.")],
    db: DbOption = None,
    json_: JsonOption = False,
    dir_: DirOption = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the export here.")] = None,
) -> None:
    """Export a Run's trace records with inclusion proofs against the newest checkpoint."""
    store = _open(db)
    directory = checkpoint_dir(dir_)
    cp = latest_checkpoint(directory)
    if cp is None:
        fail(f"no checkpoint in {directory}: run `harness audit checkpoint` first")
    doc = export_run(store, run_id, cp)
    if doc["complete"] and not doc["closed"]:
        sys.stderr.write(f"warning: run {run_id} has not closed: its export cannot prove that it holds every "
                         "record (harness-verify refuses it unless --allow-incomplete)\n")
    if not doc["complete"]:
        newer = len(doc["not_covered"]) + doc["pending_in_outbox"]
        sys.stderr.write(
            f"warning: {newer} record(s) of run {run_id} are newer than {cp.path.name} and not proven: "
            "run `harness audit checkpoint`, then export again\n"
        )
    if output is None:
        emit(doc)
    else:
        _write_export(doc, output, json_)


@audit_app.command("drain")
@cli_errors
@_audit_errors
def drain_cmd(db: DbOption = None, json_: JsonOption = False) -> None:
    """Chain every record waiting in the outbox now."""
    store = _open(db)
    chained = store.drain_all()
    seq, digest = store.chain_head()
    head = {"seq": seq, "hash": digest}
    doc = {"chained": chained, "outbox_backlog": store.outbox_backlog(), "chain_head": head}
    if json_:
        emit(doc)
    else:
        Console().print(f"chained {chained} record(s); chain head seq {seq}")
