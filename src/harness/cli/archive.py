"""`harness archive` and the read-back of archived Runs (`harness runs show ID [--from-archive]`).

archive exits 0 when the pass succeeded (also when no Run was due), 1 when it stopped before pruning
(the segment did not verify or was not stored), 2 on bad input.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.audit.places import DIR_ENV, checkpoint_dir
from harness.cli.support import EXIT_CHECK_FAILED, DbOption, JsonOption, emit, fail, finite, identifier, screen
from harness.ports.segments import SegmentStoreError
from harness.retention.storage import ENDPOINT_ENV, URL_ENV

if TYPE_CHECKING:
    from harness.domain.retention import ArchivedRun
    from harness.stores import SqlStore

ToOption = Annotated[str | None, typer.Option(
    "--to", envvar=URL_ENV, show_envvar=True,
    help="Where segments go: a directory (default ./harness-archive) or s3://bucket/prefix.")]
EndpointOption = Annotated[str | None, typer.Option(
    "--s3-endpoint", envvar=ENDPOINT_ENV, show_envvar=True,
    help="The S3-compatible server to use instead of AWS (e.g. http://127.0.0.1:9000).")]
CheckpointDirOption = Annotated[str | None, typer.Option(
    "--checkpoint-dir", envvar=DIR_ENV, show_envvar=True,
    help="Checkpoint directory (default ./harness-checkpoints/<database id>).")]


def archive(
    db: DbOption = None,
    json_: JsonOption = False,
    to: ToOption = None,
    s3_endpoint: EndpointOption = None,
    checkpoint_dir_: CheckpointDirOption = None,
    older_than_days: Annotated[float | None, typer.Option(
        "--older-than-days", min=0, callback=finite("--older-than-days"),
        help="Archive final Runs unchanged for this many days (default: HARNESS_RETENTION_DAYS; per-tenant "
             "HARNESS_RETENTION_TENANTS still apply).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many Runs (one segment).")] = None,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="Write and check the segment, keep the Runs.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say which Runs are due.")] = False,
    witness: Annotated[list[str] | None, typer.Option("--witness", help="A checkpoint witness, repeatable.")] = None,
) -> None:
    """Move final Runs past the retention period into an archive segment, proven against a new signed
    checkpoint, then prune them from the database (the chain keeps their hashes, so it still verifies)."""
    from harness.audit.witness import configured_witnesses
    from harness.retention.archiver import ArchiveError, Archiver
    from harness.retention.policy import RetentionPolicy
    from harness.settings import Settings
    from harness.stores import open_store
    from harness.wiring.retention import archive_rows, open_segment_store
    from harness.wiring.signer import checkpoint_signer

    policy = RetentionPolicy.from_env()
    if older_than_days is not None:
        policy = policy.model_copy(update={"days": older_than_days})
    if policy.days is None and all(d is None for d in policy.tenants.values()):
        fail("no retention period: give --older-than-days or set HARNESS_RETENTION_DAYS")
    settings = Settings.from_env()
    settings.check_witnesses(witness or ())  # before anything is opened; HARNESS_CHECKPOINT_WITNESS: by from_env
    store = open_store(db)
    directory = checkpoint_dir(checkpoint_dir_, store.database_id())
    archiver = Archiver(archive_rows(store), open_segment_store(to, s3_endpoint), directory, policy=policy,
                        witnesses=configured_witnesses(witness, settings.witness_rule()),
                        signer=checkpoint_signer(settings))
    if dry_run:
        due = archiver.choose(limit)
        emit({"due": due, "policy": policy.describe()}) if json_ else screen().print(
            f"{len(due)} Run(s) due ({policy.describe()})")
        return
    try:
        report = archiver.run(limit=limit, prune=not no_prune)
    except (ArchiveError, SegmentStoreError) as exc:
        fail(str(exc), EXIT_CHECK_FAILED)
    if json_:
        emit(report.to_dict())
    elif not report.runs:
        screen().print(f"nothing to archive ({policy.describe()})")
    else:
        screen().print(
            f"archived {report.runs} Run(s), {report.records} record(s) to {report.location} "
            f"({report.bytes / 1e6:.1f} MB), proven against {report.checkpoint}; pruned {report.pruned_runs} "
            f"Run(s) in {report.seconds:.1f} s" + (f"; {len(report.kept)} kept (changed meanwhile)" if report.kept
                                                     else ""), highlight=False)


def _ts(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


def archived_or_none(store: SqlStore, run_id: str) -> ArchivedRun | None:
    """Where an archived Run is, when it was archived."""
    from harness.stores import archived_run

    return archived_run(store, run_id)


def read_back(archived: ArchivedRun, directory: Path, endpoint: str | None) -> dict[str, Any]:
    """The archived Run's line of its segment, after the segment is checked against its checkpoint."""
    from harness.retention import readback
    from harness.wiring.retention import segment_locator

    try:
        return readback.read_back(archived, directory, segment_locator(endpoint))
    except readback.SegmentUnavailableError as exc:
        fail(str(exc))
    except readback.SegmentUnverifiedError as exc:
        fail(str(exc), EXIT_CHECK_FAILED)


def show_archived(store: SqlStore, archived: ArchivedRun, *, json_: bool, from_archive: bool,
                  checkpoint_dir_: str | None, endpoint: str | None) -> None:
    """`runs show` of an archived Run: where it is, and with --from-archive what it held."""
    where = {k: _ts(v) if k.endswith("_at") else v for k, v in archived.to_dict().items()}
    doc: dict[str, Any] = {"run_id": archived.run_id, "archived": where, "state": archived.state,
                           "tenant_id": archived.tenant_id, "created_at": _ts(archived.created_at),
                           "last_state_change_at": _ts(archived.closed_at)}
    if from_archive:
        line = read_back(archived, checkpoint_dir(checkpoint_dir_, store.database_id()), endpoint)
        run = line["run"]
        transitions = line["tables"].get("transitions", [])
        doc.update({
            "verified": True, "close_reason": run.get("close_reason"), "user_id": run.get("user_id"),
            "session_id": run.get("session_id"), "result": run.get("result"),
            "path": [t["to_state"] for t in transitions],
            "transitions": [{"seq": t["seq"], "from": t["from_state"], "to": t["to_state"], "at": _ts(t["at"]),
                             "actor": t["actor"], "reason": t["reason"], "forced_by": t.get("forced_by")}
                            for t in transitions],
            "records": len(line["records"]),
        })
    if json_:
        emit(doc)
        return
    console = screen()
    console.print(f"[bold]Run {archived.run_id}[/]  state [bold]{archived.state}[/]  ARCHIVED "
                  f"{_ts(archived.archived_at)} in segment {archived.segment_id}", highlight=False)
    console.print(f"  at {archived.location} (proven against {archived.checkpoint})", highlight=False)
    if from_archive:
        console.print(f"  read back and verified: {doc['records']} record(s); path {' → '.join(doc['path'])}",
                      highlight=False)
    else:
        console.print("  read it back with --from-archive", highlight=False)


def erase(
    user: Annotated[str, typer.Option("--user", help="The person whose data is erased (their user id).",
                                      callback=identifier("--user"))],
    tenant: Annotated[str, typer.Option("--tenant", help="Their tenant.", callback=identifier("--tenant"))] = "default",
    db: DbOption = None,
    json_: JsonOption = False,
    s3_endpoint: EndpointOption = None,
    no_vacuum: Annotated[bool, typer.Option(
        "--no-vacuum", help="SQLite: skip the VACUUM that rewrites the file (long on a large database); the "
        "erased data is still overwritten in place and the WAL truncated.")] = False,
    vacuum_full: Annotated[bool, typer.Option(
        "--vacuum-full", help="PostgreSQL: VACUUM FULL, MariaDB: OPTIMIZE TABLE the tables an erasure touches "
        "(they are locked while rewritten); without it the freed space waits for autovacuum.")] = False,
) -> None:
    """Honour an erasure request: delete the person's memory entries and stored contents, replace their
    personal data in their Runs' live and archived records by a salted hash (the chain and the segments
    still verify), overwrite the freed space, and audit the erasure under a pseudonym."""
    from harness.retention.archiver import ArchiveError
    from harness.stores import open_store
    from harness.wiring.retention import erase_user

    store = open_store(db)
    try:
        report = erase_user(store, tenant, user, endpoint=s3_endpoint, vacuum=not no_vacuum,
                            vacuum_full=vacuum_full)
    except (ArchiveError, SegmentStoreError) as exc:
        fail(str(exc), EXIT_CHECK_FAILED)
    if json_:
        emit(report.to_dict())
        return
    screen().print(f"erased {report.runs} Run(s) ({report.records} record(s) redacted), {report.archived_runs} "
                    f"archived Run(s) in {len(report.segments_rewritten)} segment(s), {report.memory_entries} "
                    f"memory entr(ies), {report.blobs} stored content(s); the person is now {report.subject}",
                    highlight=False)
    if report.space:
        screen().print(f"freed space: {', '.join(report.space)}", highlight=False)
    if report.still_running:
        screen().print(f"{len(report.still_running)} Run(s) still running were left alone: erase again once they "
                        "close", highlight=False)
