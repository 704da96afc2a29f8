"""Costs recorded at once by many writers of one tenant: each total on one row against spread over rows.

Every cost is added to its user's and its tenant's running totals (`spend_totals`) in the cost's own
transaction, and the row lock that upsert takes is held until the commit. With one row per total every
writer of a tenant waits for the commits before it; spread over 16 rows (a Run's costs to the row its id
picks), two writers meet one time in 16. Here P processes, each one writer (as service replicas and
workers are), record M costs each for one tenant and a few users, every cost of a Run of its own, through
`CostLedger.record_in` (the cost, its totals and its CostTrace in one transaction, committed). The two
setups alternate round by round on fresh databases; reported: the median wall of each, costs per second,
the median time one cost's transaction took, and the ratio against one row in the same run.

On loopback a commit takes a fraction of a millisecond, so the row lock is held briefly and the writers'
own CPU bounds the rate. `--hold-ms H` keeps each transaction open H ms after its totals upsert, before
the commit: what a database across a network (the COMMIT's round trip), a slow disk or a synchronous
replica adds to the time a lock is held. It stands in for that latency; it is not a harness cost.

Run:  python benchmarks/bench_spend_totals.py [--backends postgresql,mariadb,sqlite] [--writers 8]
                                              [--costs 200] [--rounds 3] [--hold-ms 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from bench_trace_drain import database

from harness.adapters.sql.ledger import SHARDS, CostLedger
from harness.adapters.sql.store import SqlStore
from harness.clock import SystemClock
from harness.domain.traces import CostTrace

USERS = ("ana", "bo", "cy", "dee")


def _writer(url: str, shards: int, hold_s: float, writer: int, costs: int, ready: Any, start: Any,
            out: Any) -> None:
    """One process: `costs` costs of Runs of its own, each recorded in its own transaction."""
    store = SqlStore.open(url, SystemClock(), migrate_schema=False)
    ledger = CostLedger(store, shards=shards)
    took: list[float] = []
    try:
        ledger.spent(tenant_id="acme")  # connected
        ready.put(writer)
        start.wait()
        for i in range(costs):
            cost = CostTrace(run_id=f"run-{writer}-{i}", source="llm:bench:plan", input_tokens=10, output_tokens=5,
                             usd=1 / 1024, tenant_id="acme", user_id=USERS[(writer + i) % len(USERS)])
            began = time.perf_counter()
            with store.engine.begin() as conn:
                ledger.record_in(conn, cost)
                if hold_s:
                    conn.execute(sa.text("SELECT 1"))  # the upsert, queued until the next statement, runs
                    time.sleep(hold_s)
            took.append(time.perf_counter() - began)
    finally:
        store.close()
    out.put(statistics.median(took))


def _collect(answers: Any, procs: list[Any], limit_s: float) -> list[Any]:
    """One answer from each writer; a writer that died, or a deadline passed, ends the benchmark with why
    (the writer's own traceback is on stderr above)."""
    got: list[Any] = []
    deadline = time.monotonic() + limit_s
    while len(got) < len(procs):
        try:
            got.append(answers.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"{len(dead)} writer(s) failed (exit codes {dead})") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(procs) - len(got)} writer(s) did not answer within {limit_s:g} s") from None
    return got


def measure(url: str, shards: int, writers: int, costs: int, hold_s: float = 0.0) -> dict[str, float]:
    """Wall, rate and median record time of `writers` processes recording `costs` costs each."""
    SqlStore.open(url, SystemClock()).close()  # migrated once, before the writers start
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, shards, hold_s, w, costs, ready, start, out))
             for w in range(writers)]
    for p in procs:
        p.start()
    _collect(ready, procs, 120)  # every writer imported, connected and waiting
    began = time.perf_counter()
    start.set()
    medians = _collect(out, procs, 600)
    wall = time.perf_counter() - began
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"a writer exited with {p.exitcode}")
    store = SqlStore.open(url, SystemClock(), migrate_schema=False)
    try:  # every update kept: the tenant's total counts every cost
        spent = CostLedger(store).spent(tenant_id="acme")
    finally:
        store.close()
    if spent != writers * costs / 1024:
        raise SystemExit(f"lost updates: {spent * 1024:.0f} of {writers * costs} costs in the total")
    return {"wall_s": wall, "costs_per_s": writers * costs / wall, "record_ms": 1000 * statistics.median(medians)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="postgresql,mariadb,sqlite")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--costs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hold-ms", type=float, default=0.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            rounds: dict[int, list[dict[str, float]]] = {1: [], SHARDS: []}
            for _ in range(args.rounds):
                for shards in (1, SHARDS):
                    with database(backend, Path(tmp)) as url:
                        rounds[shards].append(measure(url, shards, args.writers, args.costs, args.hold_ms / 1000))
            summary = {}
            for shards, runs in rounds.items():
                summary[f"shards={shards}"] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                summary[f"shards={shards}"]["walls"] = [round(r["wall_s"], 2) for r in runs]
            summary["wall_ratio"] = summary[f"shards={SHARDS}"]["wall_s"] / summary["shards=1"]["wall_s"]
            results[backend] = summary
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.writers} writer processes x {args.costs} costs, one tenant, {args.rounds} rounds each (medians)"
          + (f", each transaction held {args.hold_ms:g} ms after its upsert" if args.hold_ms else ""))
    print(f"{'backend':<11} {'rows a total':>12} {'wall s':>8} {'costs/s':>8} {'record ms':>10}  walls")
    for backend, summary in results.items():
        for shards in (1, SHARDS):
            r = summary[f"shards={shards}"]
            print(f"{backend:<11} {shards:>12} {r['wall_s']:>8.2f} {r['costs_per_s']:>8.0f} {r['record_ms']:>10.2f}"
                  f"  {r['walls']}")
        print(f"{backend:<11} spread/one row, wall: {summary['wall_ratio']:.2f}")


if __name__ == "__main__":
    main()
