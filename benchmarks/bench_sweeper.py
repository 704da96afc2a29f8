"""The zombie sweeper's scan time must not grow with the number of final Runs (issue 8, SPEC S1).

    python benchmarks/bench_sweeper.py --final 1000000
    python benchmarks/bench_sweeper.py --final 2000 --json          # smoke

Two SQLite databases hold the same 500 live Runs (stuck past their threshold but heartbeating, so the
sweep scans and reports them without forcing anything) and either a small or a large number of final
Runs. The sweep's scan — one indexed query per non-final state — is timed on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

LIVE = 500
FINAL_STATES = ("SUCCEEDED", "CLOSED_FAILED", "CLOSED_REJECTED", "CLOSED_CANCELLED")


def _fill(path: Path, finals: int) -> Any:
    from harness.adapters.sql.store import SqlStore
    from harness.clock import FakeClock

    clock = FakeClock()
    store = SqlStore.open(str(path), clock)
    now = clock.now()
    rows = []

    def row(state: str, changed: float, lease: float | None) -> dict[str, Any]:
        return {"run_id": str(uuid.uuid4()), "tenant_id": "t", "user_id": "u", "session_id": "s", "state": state,
                "version": 1, "created_at": changed, "last_state_change_at": changed, "lease_epoch": 1,
                "lease_expires_at": lease, "lease_owner": "w" if lease else None, "stall_count": 0,
                "request": "{}"}

    conn = store.engine.raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        sql = ("INSERT INTO runs (run_id, tenant_id, user_id, session_id, state, version, created_at, "
               "last_state_change_at, lease_epoch, lease_expires_at, lease_owner, stall_count, request) VALUES "
               "(:run_id, :tenant_id, :user_id, :session_id, :state, :version, :created_at, "
               ":last_state_change_at, :lease_epoch, :lease_expires_at, :lease_owner, :stall_count, :request)")
        for i in range(finals):
            rows.append(row(FINAL_STATES[i % 4], now - 10_000 - i, None))
            if len(rows) >= 50_000:
                cursor.executemany(sql, rows)
                rows.clear()
        for i in range(LIVE):  # in EXECUTING past its threshold, within its heartbeat ceiling: healthy
            rows.append(row("EXECUTING", now - 700 - i, now + 60))
        cursor.executemany(sql, rows)
        cursor.execute("COMMIT")
    finally:
        conn.close()
    return store, clock


def scan_time(finals: int, repeats: int) -> dict[str, float]:
    """Median seconds of one sweep over a database with `finals` final Runs and LIVE live ones."""
    from harness.drive.state_machine import StateMachine
    from harness.drive.sweeper import ZombieSweeper

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store, _ = _fill(Path(tmp) / "s.db", finals)
        fill_s = time.perf_counter() - started
        sweeper = ZombieSweeper(store, StateMachine(store), batch=LIVE)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            report = sweeper.sweep_once()
            times.append(time.perf_counter() - t0)
        assert len(report.healthy) == LIVE and not report.detected
        store.close()
    return {"final_runs": finals, "scan_ms": statistics.median(times) * 1000, "fill_s": fill_s}


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--final", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    small, large = scan_time(args.small, args.repeats), scan_time(args.final, args.repeats)
    report = {"small": small, "large": large, "ratio": large["scan_ms"] / small["scan_ms"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"sweep scan with {LIVE} live Runs: {small['scan_ms']:.2f} ms among {small['final_runs']:,} final Runs, "
          f"{large['scan_ms']:.2f} ms among {large['final_runs']:,} (ratio {report['ratio']:.2f})")


if __name__ == "__main__":
    main()
