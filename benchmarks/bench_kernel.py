"""Kernel throughput against plain sqlite3, measured in the same run (issue: kernel benchmark).

Two numbers, each with its baseline:

* transitions per second for complete Runs, CREATED → PREPARING → PLANNING → POLICY_CHECK → EXECUTING →
  TRACING → SUCCEEDED, every state change persisted with its audit events, legacy projection and outbox
  records, and each Run's records drained into the hash chain when it closes. The harness side is
  `SqlStore.create_run` + `StateMachine.transition` (which funnels TRACING → SUCCEEDED and drains). The
  baseline is plain `sqlite3` on the same schema and pragmas (WAL, synchronous=NORMAL) doing the same
  row writes with one commit per state change: UPDATE runs (compare-and-set on state and version),
  INSERT transitions, UPDATE jobs, INSERT audit_events where the harness writes one, INSERT outbox
  (the transition record, each audit record, the RunTrace on close), then the drain (read the head and
  the outbox, SHA-256 each record, INSERT trace_records, UPDATE chain_head, DELETE outbox).
  A state change is one row in `transitions` (seven per Run, CREATED included).
* audit verification in records per second: the baseline is a plain sqlite3 walk that recomputes
  SHA-256 per record and checks each link; the harness side is `harness.audit.verify.verify_chain`
  (chain walk, Merkle accumulation and the cross-checks against the kernel tables), and, for reference,
  the bare chain recomputation through `record_hash` over `SqlStore.iter_trace`.

Each repeat uses fresh database files and alternates which side goes first; the report gives medians.

Run:  python benchmarks/bench_kernel.py [--runs N] [--repeats R] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.domain.chain import GENESIS_HASH, record_hash
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.events import audit_events_for
from harness.kernel.projection import job_status
from harness.kernel.states import RunState

S = RunState
PATH = [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING]
CLOSE = (S.TRACING, S.SUCCEEDED)  # the kernel's own step on the harness side
TABLES = ("runs", "jobs", "transitions", "audit_events", "trace_records", "outbox")
REQUEST = {"task": "Where is order A-1001?", "channel": "chat"}


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _row_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}


def _fresh_db(folder: Path, name: str) -> Path:
    """A migrated, empty database file: the harness's schema, indexes and append-only triggers."""
    path = folder / name
    SqlStore.open(str(path)).close()
    return path


# ------------------------------------------------------------------------------------- the harness


def harness_runs(db: Path, runs: int) -> float:
    """Seconds for `runs` complete Runs through the store and the state machine."""
    store = SqlStore.open(str(db), migrate_schema=False)
    machine = StateMachine(store)  # drains the outbox when a Run closes
    try:
        start = time.perf_counter()
        for i in range(runs):
            run, _ = store.create_run(NewRun("acme", "alice", f"s{i}", REQUEST))
            source = S.CREATED
            for target in PATH:
                machine.transition(run.run_id, source, target, actor="bench", reason="step done")
                source = target
        elapsed = time.perf_counter() - start
        if store.get_run(run.run_id).state != S.SUCCEEDED or store.outbox_backlog():
            raise RuntimeError("the harness did not close and drain every Run")
        return elapsed
    finally:
        store.close()


# ------------------------------------------------------------------------------------- the baseline


class PlainSqlite:
    """The same row writes as the harness, by hand, on one sqlite3 connection."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(db, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=60000", "foreign_keys=ON"):
            self.conn.execute(f"PRAGMA {pragma}")

    def close(self) -> None:
        self.conn.close()

    def _outbox(self, rows: list[tuple[str, str, str]], now: float) -> None:
        self.conn.executemany(
            "INSERT INTO outbox (record_id, run_id, kind, payload, created_at) VALUES (?, ?, ?, ?, ?)",
            [(str(uuid.uuid4()), run_id, kind, payload, now) for run_id, kind, payload in rows],
        )

    def _audit(self, run_id: str, events: tuple[str, ...], detail: dict[str, Any], now: float
               ) -> list[tuple[str, str, str]]:
        records = []
        for event in events:
            event_id = str(uuid.uuid4())
            self.conn.execute(
                "INSERT INTO audit_events (event_id, run_id, event, actor, detail, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (event_id, run_id, event, "bench", _dumps(detail), now),
            )
            records.append((run_id, "audit", _dumps(
                {"event_id": event_id, "event": event, "actor": "bench", "detail": detail, "at": now}
            )))
        return records

    def _change(self, run_id: str, seq: int, source: RunState | None, target: RunState, *, now: float,
                extra: list[tuple[str, str, str]]) -> None:
        """Everything besides runs.state: transition row, projection, audit events, outbox."""
        frm = source.value if source else None
        self.conn.execute(
            "INSERT INTO transitions (run_id, seq, from_state, to_state, actor, reason, forced_by, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, seq, frm, target.value, "bench", "step done", None, now),
        )
        status = job_status(target).value
        if source is None:
            self.conn.execute(
                "INSERT INTO jobs (job_id, status, run_state_snapshot, updated_at) VALUES (?, ?, ?, ?)",
                (run_id, status, target.value, now),
            )
        else:
            self.conn.execute(
                "UPDATE jobs SET status = ?, run_state_snapshot = ?, updated_at = ? WHERE job_id = ?",
                (status, target.value, now, run_id),
            )
        payload = {"run_id": run_id, "seq": seq, "from": frm, "to": target.value, "actor": "bench",
                   "reason": "step done", "forced_by": None, "at": now}
        records = [(run_id, "transition", _dumps(payload))]
        detail = {"from": frm, "to": target.value, "reason": "step done", "forced_by": None}
        records += self._audit(run_id, audit_events_for(source, target), detail, now)
        self._outbox(records + extra, now)

    def create(self, run_id: str, i: int) -> None:
        now = time.time()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(
            "INSERT INTO runs (run_id, tenant_id, user_id, session_id, state, version, created_at, "
            "last_state_change_at, lease_epoch, stall_count, request) "
            "VALUES (?, ?, ?, ?, ?, 0, ?, ?, 0, 0, ?)",
            (run_id, "acme", "alice", f"s{i}", S.CREATED.value, now, now, _dumps(REQUEST)),
        )
        self._change(run_id, 0, None, S.CREATED, now=now, extra=[])
        self.conn.execute("COMMIT")

    def transition(self, run_id: str, seq: int, source: RunState, target: RunState, *, close_reason: str,
                   extra: list[tuple[str, str, str]]) -> None:
        now = time.time()
        self.conn.execute("BEGIN IMMEDIATE")
        moved = self.conn.execute(
            "UPDATE runs SET state = ?, close_reason = ?, version = ?, last_state_change_at = ? "
            "WHERE run_id = ? AND state = ? AND version = ?",
            (target.value, close_reason, seq, now, run_id, source.value, seq - 1),
        ).rowcount
        if moved != 1:
            raise RuntimeError("baseline compare-and-set failed")
        self._change(run_id, seq, source, target, now=now, extra=extra)
        self.conn.execute("COMMIT")

    def drain(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        seq, head = self.conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
        prev = head.hex()  # the chain stores a digest's 32 bytes and hashes its hex
        pending = self.conn.execute(
            "SELECT id, record_id, run_id, kind, payload FROM outbox ORDER BY id LIMIT 500"
        ).fetchall()
        rows = []
        for _, record_id, run_id, kind, payload in pending:
            seq += 1
            digest = hashlib.sha256(_canonical(seq, record_id, run_id, kind, prev, payload)).hexdigest()
            rows.append((seq, record_id, run_id, kind, payload, bytes.fromhex(prev), bytes.fromhex(digest)))
            prev = digest
        self.conn.executemany(
            "INSERT INTO trace_records (seq, record_id, run_id, kind, payload, prev_hash, hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", rows,
        )
        self.conn.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1", (seq, bytes.fromhex(prev)))
        self.conn.execute(f"DELETE FROM outbox WHERE id IN ({','.join('?' * len(pending))})",
                          [p[0] for p in pending])
        self.conn.execute("COMMIT")


def _run_trace(run_id: str, reason: str | None) -> tuple[str, str, str]:
    """The RunTrace outbox row the harness writes when a Run closes (final state, path, trace hash)."""
    path = [s.value for s in [S.CREATED, *PATH, S.SUCCEEDED]]
    return (run_id, "run", _dumps({"run_id": run_id, "final_state": S.SUCCEEDED.value, "transitions": path,
                                   "close_reason": reason, "trace_hash": _sha256(_dumps(path))}))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(*fields: Any) -> bytes:
    """The chain's canonical bytes of (seq, record_id, run_id, kind, prev_hash, payload), written out by
    hand (see harness.domain.chain)."""
    seq, record_id, run_id, kind, prev, payload = fields
    return json.dumps([seq, record_id, run_id or "", kind, prev, payload], separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def baseline_runs(db: Path, runs: int) -> float:
    """Seconds for `runs` complete Runs written by hand with plain sqlite3."""
    plain = PlainSqlite(db)
    try:
        start = time.perf_counter()
        for i in range(runs):
            run_id = str(uuid.uuid4())
            plain.create(run_id, i)
            source, reason = S.CREATED, None
            for seq, target in enumerate([*PATH, CLOSE[1]], start=1):
                if target == S.TRACING:
                    reason = "success"
                extra = [_run_trace(run_id, reason)] if target == S.SUCCEEDED else []
                plain.transition(run_id, seq, source, target, close_reason=reason or "", extra=extra)
                source = target
            plain.drain()
        return time.perf_counter() - start
    finally:
        plain.close()


# ------------------------------------------------------------------------------------- verification


def plain_walk(db: Path) -> tuple[float, int]:
    """Seconds to walk the chain with plain sqlite3, recomputing every hash; and the record count."""
    conn = sqlite3.connect(db)
    try:
        start = time.perf_counter()
        prev, expected = GENESIS_HASH, 1
        cursor = conn.execute(
            "SELECT seq, record_id, run_id, kind, prev_hash, payload, hash FROM trace_records ORDER BY seq"
        )
        for seq, record_id, run_id, kind, stored_prev, payload, stored in cursor:
            prev_hash, digest = stored_prev.hex(), stored.hex()
            canonical = _canonical(seq, record_id, run_id, kind, prev_hash, payload)
            if seq != expected or prev_hash != prev or hashlib.sha256(canonical).hexdigest() != digest:
                raise RuntimeError(f"chain broken at {seq}")
            prev, expected = digest, expected + 1
        return time.perf_counter() - start, expected - 1
    finally:
        conn.close()


def harness_recompute(db: Path) -> float:
    """Seconds for the bare chain recomputation through record_hash over SqlStore.iter_trace."""
    store = SqlStore.open(str(db), migrate_schema=False)
    try:
        start = time.perf_counter()
        prev = GENESIS_HASH
        for rec in store.iter_trace():
            if rec.prev_hash != prev or record_hash(
                rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload
            ) != rec.hash:
                raise RuntimeError(f"chain broken at {rec.seq}")
            prev = rec.hash
        return time.perf_counter() - start
    finally:
        store.close()


def _verifier() -> Callable[[SqlAuditReads], Any] | None:
    try:
        from harness.audit.verify import verify_chain
    except ImportError:
        return None
    return verify_chain


def harness_verify(db: Path) -> float | None:
    """Seconds for the real verifier (verify_chain), or None when it is not available."""
    verify = _verifier()
    if verify is None:
        return None
    store = SqlStore.open(str(db), migrate_schema=False)
    try:
        start = time.perf_counter()
        report = verify(SqlAuditReads(store))
        elapsed = time.perf_counter() - start
        if not report.ok:
            raise RuntimeError(f"verify_chain found problems: {report.first_bad}")
        return elapsed
    finally:
        store.close()


# ------------------------------------------------------------------------------------- the report


def measure(runs: int, repeats: int) -> dict[str, Any]:
    """Run every measurement `repeats` times; medians and ratios."""
    keys = ("harness_tps", "baseline_tps", "plain_walk_rps", "verify_rps", "recompute_rps")
    samples: dict[str, list[float]] = {k: [] for k in keys}
    counts: dict[str, dict[str, int]] = {}
    records = 0
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-kernel-") as tmp:
            folder = Path(tmp)
            h_db, b_db = _fresh_db(folder, "harness.db"), _fresh_db(folder, "baseline.db")
            sides = [("harness", harness_runs, h_db), ("baseline", baseline_runs, b_db)]
            elapsed = {name: fn(db, runs) for name, fn, db in (sides if r % 2 == 0 else sides[::-1])}
            counts = {"harness": _row_counts(h_db), "baseline": _row_counts(b_db)}
            transitions = counts["harness"]["transitions"]
            samples["harness_tps"].append(transitions / elapsed["harness"])
            samples["baseline_tps"].append(counts["baseline"]["transitions"] / elapsed["baseline"])
            walk_s, records = plain_walk(h_db)
            samples["plain_walk_rps"].append(records / walk_s)
            samples["recompute_rps"].append(records / harness_recompute(h_db))
            verify_s = harness_verify(h_db)
            if verify_s is not None:
                samples["verify_rps"].append(records / verify_s)
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    result: dict[str, Any] = {
        "runs": runs,
        "repeats": repeats,
        "transitions_per_run": counts["harness"]["transitions"] // runs,
        "chain_records": records,
        "row_counts": counts,
        "medians": med,
        "samples": samples,
        "transition_ratio": med["baseline_tps"] / med["harness_tps"],
        "ms_per_run": {"harness": 1000 * counts["harness"]["transitions"] / runs / med["harness_tps"],
                       "baseline": 1000 * counts["baseline"]["transitions"] / runs / med["baseline_tps"]},
        "verifier": "harness.audit.verify.verify_chain" if "verify_rps" in med else None,
        "verify_ratio": med["plain_walk_rps"] / med["verify_rps"] if "verify_rps" in med else None,
        "recompute_ratio": med["plain_walk_rps"] / med["recompute_rps"],
    }
    return result


def _print(result: dict[str, Any]) -> None:
    m = result["medians"]
    print(f"kernel benchmark: {result['runs']} Runs x {result['transitions_per_run']} state changes, "
          f"median of {result['repeats']} repeats, {result['chain_records']} chained records")
    print(f"  transitions/s   harness {m['harness_tps']:9.0f}   plain sqlite3 {m['baseline_tps']:9.0f}   "
          f"ratio {result['transition_ratio']:.2f}x")
    print(f"  ms per Run      harness {result['ms_per_run']['harness']:9.2f}   "
          f"plain sqlite3 {result['ms_per_run']['baseline']:9.2f}")
    if result["verifier"]:
        print(f"  verify rec/s    verify_chain {m['verify_rps']:9.0f}   "
              f"plain walk {m['plain_walk_rps']:9.0f}   ratio {result['verify_ratio']:.2f}x")
    else:
        print("  verify rec/s    harness.audit.verify is not available; see recomputation below")
    print(f"  recompute rec/s record_hash over iter_trace {m['recompute_rps']:9.0f}   "
          f"plain walk {m['plain_walk_rps']:9.0f}   ratio {result['recompute_ratio']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="complete Runs per repeat (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeats < 1:
        parser.error("--runs and --repeats must be at least 1")
    result = measure(args.runs, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
