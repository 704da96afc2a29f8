"""`harness audit …`: verify, reconcile, checkpoint, rotate-key, export, drain (SPEC A3, A3b, A4, K8).

verify and reconcile exit 1 when they find a problem; a database refusing a checkpoint or an export
because its history no longer matches a signed checkpoint also exits 1. Bad input exits 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from harness.audit.places import DEFAULT_DIR, DIR_ENV, WITNESS_ENV, checkpoint_dir
from harness.cli.support import EXIT_CHECK_FAILED, DbOption, JsonOption, cli_errors, emit, fail, screen

if TYPE_CHECKING:
    from harness.audit.checkpoint_files import Checkpoint
    from harness.audit.reconcile import ReconcileReport
    from harness.audit.witness import Witness
    from harness.domain.audit import ChainReport
    from harness.stores import SqlStore

P = ParamSpec("P")
R = TypeVar("R")

audit_app = typer.Typer(help="Verify and publish the tamper-evident audit trail.", no_args_is_help=True)

DirOption = Annotated[
    str | None,
    typer.Option("--dir", envvar=DIR_ENV, show_envvar=True,
                 help="Checkpoint directory (default ./harness-checkpoints/<database id>)."),
]
WitnessOption = Annotated[
    list[str] | None,
    typer.Option("--witness", show_default=False,
                 help=f"A witness that keeps a copy of every checkpoint: a directory or an http(s) URL "
                      f"(`harness witness serve`); repeatable (default: {WITNESS_ENV}, comma-separated)."),
]
LimitOption = Annotated[int, typer.Option("--limit", min=1, help="List at most this many problems.")]


def _audit_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Database failures are bad input (exit 2); a history that contradicts a checkpoint fails (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        # every audit command opens a store: the audit code and the composition root load as it runs
        from harness.audit.checkpoint import TamperedHistoryError
        from harness.stores import DatabaseError

        try:
            return fn(*args, **kwargs)
        except TamperedHistoryError as exc:
            fail(f"tampered history: {exc}", EXIT_CHECK_FAILED)
        except DatabaseError as exc:
            fail(f"database error: {str(exc.orig) if hasattr(exc, 'orig') else exc}")

    return wrapper


def _store(db: str | None) -> SqlStore:
    """The store named by `db`, which must exist."""
    from harness.stores import open_existing_store

    return open_existing_store(db)


def _witnesses(options: list[str] | None) -> list[Witness]:
    """The witnesses the options (else HARNESS_CHECKPOINT_WITNESS) name; a URL at an internal address the
    settings do not allow is refused (exit 2) before anything is sent."""
    from harness.audit.witness import configured_witnesses
    from harness.settings import Settings

    settings = Settings.from_env()
    settings.check_witnesses(options or ())  # HARNESS_CHECKPOINT_WITNESS is checked by from_env
    return configured_witnesses(options, settings.witness_rule())


def _print_verify(report: ChainReport) -> None:
    console = screen()
    verdict = "[green]OK[/]" if report.ok else f"[red]FAILED[/] ({report.problem_count} problem(s))"
    console.print(f"audit chain: {verdict}  {report.records_checked} records, {report.rows_checked} rows, "
                  f"head seq {report.chain_head.get('seq')}, {report.checkpoints_checked} checkpoint(s), "
                  f"outbox backlog {report.outbox_backlog}, database {report.database_id}")
    for warning in report.warnings:
        console.print(f"[bold yellow]WARNING[/] {warning}", highlight=False)
    if report.first_bad:
        bad = report.first_bad
        console.print(f"first bad: [bold]{bad.kind}[/] seq={bad.seq} record={bad.record_id} "
                      f"run={bad.run_id}: {bad.detail}")
    if len(report.problems) > 1:
        from rich.table import Table

        table = Table("kind", "seq", "record", "run", "table", "field", "detail")
        for p in report.problems:
            table.add_row(p.kind, str(p.seq or ""), p.record_id or "", p.run_id or "", p.table or "", p.field or "",
                          p.detail)
        console.print(table)


@audit_app.command("verify")
@cli_errors
@_audit_errors
def verify(
    ctx: typer.Context,
    db: DbOption = None,
    json_: JsonOption = False,
    checkpoint_dir_: Annotated[
        str | None, typer.Option("--checkpoint-dir", envvar=DIR_ENV,
                                 help="The checkpoints to check against (default ./harness-checkpoints/<database "
                                      "id>).")
    ] = None,
    witness: WitnessOption = None,
    require_checkpoint: Annotated[bool, typer.Option(
        "--require-checkpoint", help="Fail (exit 1) when there is no checkpoint of this database to check "
                                     "against, instead of warning.")] = False,
    limit: LimitOption = 20,
) -> None:
    """Walk the hash chain, check every row people read against it and the chain against the signed
    checkpoints (local and witnessed); exit 1 naming the first bad record, or the table, row and field."""
    store = _store(db)
    directory = checkpoint_dir(checkpoint_dir_, store.database_id())
    # a folder typed on the command line must exist (a typo is bad input); the one HARNESS_CHECKPOINT_DIR
    # names is created by the first checkpoint, and until then there are no checkpoints yet (a warning)
    source = ctx.get_parameter_source("checkpoint_dir_")
    typed = source is not None and source.name == "COMMANDLINE"
    if typed and not directory.is_dir():
        fail(f"checkpoint directory {directory} does not exist")
    legacy = None if checkpoint_dir_ else Path(DEFAULT_DIR)
    from harness.audit.verify import verify_chain
    from harness.stores import audit_reads

    report = verify_chain(audit_reads(store), directory, limit=limit, witnesses=_witnesses(witness),
                          legacy_dir=legacy, require_checkpoint=require_checkpoint)
    if json_:
        emit(report.to_dict())
    else:
        _print_verify(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _print_reconcile(report: ReconcileReport) -> None:
    console = screen()
    console.print(f"reconcile: {'[green]OK[/]' if report.ok else '[red]MISMATCH[/]'}")
    from rich.table import Table

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
    from harness.audit.reconcile import reconcile
    from harness.stores import reconcile_reads

    report = reconcile(reconcile_reads(_store(db)), limit=limit)
    if json_:
        emit(report.to_dict())
    else:
        _print_reconcile(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@audit_app.command("checkpoint")
@cli_errors
@_audit_errors
def checkpoint_cmd(db: DbOption = None, json_: JsonOption = False, dir_: DirOption = None,
                   witness: WitnessOption = None) -> None:
    """Drain the outbox, then publish a signed Merkle tree head of the whole chain as a new file, and give
    it to the witnesses; exit 1 when a witness did not keep it."""
    from harness.audit.checkpoint import publish_checkpoint
    from harness.settings import Settings
    from harness.stores import audit_reads
    from harness.wiring.signer import checkpoint_signer

    store = _store(db)
    cp = publish_checkpoint(audit_reads(store), checkpoint_dir(dir_, store.database_id()),
                            witnesses=_witnesses(witness), signer=checkpoint_signer(Settings.from_env()))
    doc = {**cp.summary(), "path": str(cp.path), "previous": (cp.doc.get("previous") or {}).get("file"),
           "witnesses": _witnessed(cp)}
    if json_:
        emit(doc)
    else:
        console = screen()
        console.print(f"published {cp.path}: tree size {cp.tree_size}, root {cp.root_hash}")
        for w in doc["witnesses"]:
            console.print(f"  witness {w['witness']}: " + ("kept" if w["ok"] else f"[red]NOT KEPT[/]: {w['error']}"),
                          highlight=False)
    if any(not w["ok"] for w in doc["witnesses"]):
        raise typer.Exit(EXIT_CHECK_FAILED)


def _witnessed(cp: Checkpoint) -> list[dict[str, Any]]:
    return [{"witness": name, "ok": error is None, "error": error} for name, error in cp.witnessed]


@audit_app.command("rotate-key")
@cli_errors
@_audit_errors
def rotate_key_cmd(
    db: DbOption = None,
    json_: JsonOption = False,
    dir_: DirOption = None,
    new_key: Annotated[Path | None, typer.Option(
        "--new-key", help="The new Ed25519 private key (PEM, mode 0600). Default: generate one in place of "
                          "the database's key in the key folder (not when HARNESS_CHECKPOINT_KEY is set).")] = None,
    witness: WitnessOption = None,
) -> None:
    """Change the checkpoint signing key: publish a checkpoint signed by the new key and endorsed by the
    current one, so verifiers who trust the first key trust the new one; the old key signs nothing more."""
    from harness.audit.checkpoint import rotate_key
    from harness.stores import audit_reads

    store = _store(db)
    cp, key_path = rotate_key(audit_reads(store), checkpoint_dir(dir_, store.database_id()), new_key,
                              witnesses=_witnesses(witness))
    endorsement = cp.doc["endorsement"]
    doc = {**cp.summary(), "path": str(cp.path), "endorsed_by": endorsement["by_key_id"],
           "key_file": str(key_path), "witnesses": _witnessed(cp)}
    if json_:
        emit(doc)
    else:
        screen().print(f"published {cp.path}: signed by the new key {cp.doc['key_id'][:16]}…, endorsed by "
                        f"{endorsement['by_key_id'][:16]}…; the new private key is {key_path}")


def _write_export(doc: dict[str, Any], output: Path, json_: bool) -> None:
    from harness.audit.files import json_dumps

    output.write_text(json_dumps(doc) + "\n", encoding="utf-8")
    summary = {"file": str(output), "run_id": doc["run_id"], "records": len(doc["records"]),
               "not_covered": len(doc["not_covered"]), "complete": doc["complete"],
               "checkpoint": doc["checkpoint"]["file"]}
    if json_:
        emit(summary)
    else:
        screen().print(f"wrote {output}: {summary['records']} record(s) proven in {summary['checkpoint']}")


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
    from harness.audit.checkpoint_files import latest_checkpoint
    from harness.audit.export import export_run
    from harness.stores import audit_reads

    store = _store(db)
    directory = checkpoint_dir(dir_, store.database_id())
    cp = latest_checkpoint(directory)
    if cp is None:
        fail(f"no checkpoint in {directory}: publish one with `harness audit checkpoint"
             f"{' --dir ' + str(directory) if dir_ else ''}` (harness serve and the Celery beat also publish "
             "them on an interval), then export again")
    if cp.database_id not in (None, store.database_id()):
        fail(f"the newest checkpoint in {directory} is of database {cp.database_id}, not of this one "
             f"({store.database_id()}): give this database's checkpoint directory")
    doc = export_run(audit_reads(store), run_id, cp)
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


@audit_app.command("move-key")
@cli_errors
@_audit_errors
def move_key_cmd(db: DbOption = None, json_: JsonOption = False, dir_: DirOption = None) -> None:
    """Move a signing key an earlier version left in the checkpoint directory to the database's key folder
    (mode 0600), where a checkpoint directory writer cannot take it."""
    from harness.audit.keys import move_legacy_key

    store = _store(db)
    directory = checkpoint_dir(dir_, store.database_id())
    legacy = directory if (directory / "checkpoint-key.pem").exists() or dir_ else Path(DEFAULT_DIR)
    target = move_legacy_key(legacy, store.database_id())
    if json_:
        emit({"from": str(legacy / "checkpoint-key.pem"), "to": str(target)})
    else:
        screen().print(f"moved {legacy / 'checkpoint-key.pem'} to {target}")


@audit_app.command("drain")
@cli_errors
@_audit_errors
def drain_cmd(db: DbOption = None, json_: JsonOption = False) -> None:
    """Chain every record waiting in the outbox now."""
    store = _store(db)
    chained = store.drain_all()
    seq, digest = store.chain_head()
    head = {"seq": seq, "hash": digest}
    doc = {"chained": chained, "outbox_backlog": store.outbox_backlog(), "chain_head": head}
    if json_:
        emit(doc)
    else:
        screen().print(f"chained {chained} record(s); chain head seq {seq}")
