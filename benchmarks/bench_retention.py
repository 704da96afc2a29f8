"""Archive and prune N final Runs: database size before and after, archive throughput (Runs/s), and the
chain verify before and after.

    python benchmarks/bench_retention.py --runs 10000                                  # SQLite file
    python benchmarks/bench_retention.py --runs 10000 --backend postgresql             # 127.0.0.1:5432
    python benchmarks/bench_retention.py --runs 10000 --backend mariadb                # 127.0.0.1:3306

The Runs are one Run driven through the state machine, cloned by direct store writes with new ids (the
fixture of the retention tests), then chained. A fresh database per invocation (dropped afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.bulk_runs import clone, drive

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.drive.state_machine import StateMachine
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.storage import LocalSegmentStore
from harness.wiring.retention import archive_rows

ADMIN = {"postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
         "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test"}


def _create(backend: str, tmp: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return str(tmp / "bench.db"), None
    name = f"harness_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(ADMIN[backend], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    base = ADMIN[backend].rsplit("/", 1)[0]
    return f"{base}/{name}", name


def _drop(backend: str, name: str | None) -> None:
    if name is None:
        return
    admin = sa.create_engine(ADMIN[backend], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE {name}" + (" WITH (FORCE)" if backend == "postgresql" else ""))
    admin.dispose()


def size(store: SqlStore, backend: str, url: str) -> dict[str, int]:
    """The database's size in bytes: as allocated, and (SQLite) live pages only."""
    with store.engine.connect() as conn:
        if backend == "sqlite":
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return {"file": Path(url).stat().st_size, "live": (pages - free) * page}
        if backend == "postgresql":
            return {"database": int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one())}
        total = conn.exec_driver_sql("SELECT SUM(data_length + index_length) FROM information_schema.tables "
                                     "WHERE table_schema = DATABASE()").scalar_one()
        return {"tables": int(total)}


def compact(store: SqlStore, backend: str, url: str) -> None:
    """Give freed space back (what an operator runs after a large prune)."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(url, isolation_level=None)) as db:
            db.execute("VACUUM")
        return
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("VACUUM FULL")
        else:
            for table in ("trace_records", "transitions", "audit_events", "runs", "jobs"):
                conn.exec_driver_sql(f"OPTIMIZE TABLE {table}").all()
                conn.exec_driver_sql(f"ANALYZE TABLE {table}").all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "mariadb"), default="sqlite")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    url, name = _create(args.backend, tmp)
    try:
        clock = FakeClock()
        store = SqlStore.open(url, clock)
        machine = StateMachine(store)
        t0 = time.perf_counter()
        clone(store, drive(machine), args.runs - 1)
        made = time.perf_counter() - t0
        publish_checkpoint(SqlAuditReads(store), tmp / "cp")
        compact(store, args.backend, url)
        before = size(store, args.backend, url)
        t0 = time.perf_counter()
        ok_before = verify_chain(SqlAuditReads(store), tmp / "cp").ok
        verify_before = time.perf_counter() - t0
        clock.advance(40 * DAY_S)
        report = Archiver(archive_rows(store), LocalSegmentStore(tmp / "archive"), tmp / "cp",
                          policy=RetentionPolicy(days=30, batch=args.runs)).run()
        after = size(store, args.backend, url)
        compact(store, args.backend, url)
        compacted = size(store, args.backend, url)
        t0 = time.perf_counter()
        checked = verify_chain(SqlAuditReads(store), tmp / "cp")
        verify_after = time.perf_counter() - t0
        print(json.dumps({
            "backend": args.backend, "runs": args.runs, "records": report.records, "create_s": round(made, 1),
            "size_before": before, "size_after_prune": after, "size_after_compact": compacted,
            "archive_s": round(report.seconds, 2), "archive_runs_per_s": round(report.runs / report.seconds),
            "segment_bytes": report.bytes, "pruned_runs": report.pruned_runs,
            "verify_before": {"ok": ok_before, "s": round(verify_before, 2)},
            "verify_after": {"ok": checked.ok, "s": round(verify_after, 2), "pruned": checked.records_pruned},
        }, indent=1))
        store.close()
    finally:
        _drop(args.backend, name)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
