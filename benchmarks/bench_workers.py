"""Runs per second with 1, 2 and 4 Celery workers on PostgreSQL, in steady state (issues 8, 20).

    python benchmarks/bench_workers.py --runs 1000 --workers 1 2 4
    python benchmarks/bench_workers.py --runs 10 --warmup 2 --workers 1 --json        # smoke

For each worker count: a fresh PostgreSQL database (created on the loopback server, dropped after),
a private Redis broker on a free loopback port, N `celery worker --pool=solo` processes, and
example-shaped Runs (three tool calls, scripted LLM, everything persisted):

1. warm-up: `--warmup` Runs per worker are driven to the end and not counted (each worker's imports,
   Cedar, the tokenizer's vocabulary, its first connections);
2. the measured Runs: `--runs` Runs are created first (accepted, CREATED), then their tasks are sent at
   once, so the clock sees the workers alone. Runs/s is `--runs` over the time from the first task sent
   to the last Run's final state; "steady" is the rate between 10% and 90% of them done, which leaves
   out the first and last Runs' ramp (a worker still idle, the last few on fewer workers).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _done(conn: sa.Connection) -> int:
    count = conn.execute(sa.text("SELECT count(*) FROM runs WHERE state IN ('SUCCEEDED', 'FAILED')")).scalar()
    conn.rollback()
    return int(count or 0)


def _submit(rt: Any, runs: int) -> list[str]:
    """Accept `runs` Runs (CREATED, durably) without driving them."""
    return [rt.runs.submit({"task": "bench A-1001", "user_id": "alice", "roles": ["support_agent"]})[0].run_id
            for _ in range(runs)]


def _drive_all(rt: Any, app: Any, ids: list[str], until: int, limit_s: float) -> list[tuple[float, int]]:
    """Send every Run's task, then sample (seconds since the first send, Runs done) until `until` are done."""
    started = time.perf_counter()
    for run_id in ids:
        app.send_task("harness.drive", args=[run_id])
    samples = [(0.0, 0)]
    with rt.store.engine.connect() as conn:
        while samples[-1][1] < until and samples[-1][0] < limit_s:
            time.sleep(0.1)
            samples.append((time.perf_counter() - started, _done(conn)))
    return samples


def _crossing(samples: list[tuple[float, int]], count: int) -> float:
    """The time the done count first reached `count` (linear between samples)."""
    for (t0, n0), (t1, n1) in itertools.pairwise(samples):
        if n1 >= count:
            return t1 if n1 == n0 else t0 + (t1 - t0) * (count - n0) / (n1 - n0)
    return samples[-1][0]


def measure(workers: int, runs: int, warmup: int = 10, limit_s: float = 1800) -> dict[str, Any]:
    """Steady-state Runs/s for `workers` Celery workers on a fresh PostgreSQL database."""
    name = f"harness_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            _wait_port(port)
            env = {**os.environ, "HARNESS_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
                   "HARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0",
                   "HARNESS_LLM_RULES": str(HERE / "fixtures" / "bench_rules.yaml"),
                   "HARNESS_EXAMPLE_LEDGER": str(Path(tmp) / "ledger.jsonl"), "HARNESS_DATA_DIR": tmp}
            os.environ.update(env)
            from harness.celery_app import make_app
            from harness.config import build_runtime
            from harness.settings import Settings

            rt = build_runtime(Settings.from_env())  # migrates the fresh database
            app = make_app(env["HARNESS_BROKER_URL"])
            procs = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "harness.celery_app:app", "worker",
                                       "--pool=solo", "-n", f"w{i}@%h", "--without-gossip", "--without-mingle",
                                       "--without-heartbeat", "--loglevel=WARNING"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(workers)]
            warm = warmup * workers
            warm_started = time.perf_counter()
            _drive_all(rt, app, _submit(rt, warm), warm, limit_s)  # start-up and first Runs: not counted
            warm_s = time.perf_counter() - warm_started
            ids = _submit(rt, runs)
            samples = _drive_all(rt, app, ids, warm + runs, limit_s)
            with rt.store.engine.connect() as conn:
                failed = int(conn.execute(sa.text("SELECT count(*) FROM runs WHERE state <> 'SUCCEEDED'")).scalar()
                             or 0)
            rt.close()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
            redis.kill()
            redis.wait()
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()
    measured = [(t, n - warm) for t, n in samples]
    done, elapsed = measured[-1][1], _crossing(measured, runs)
    low, high = _crossing(measured, runs // 10), _crossing(measured, runs - runs // 10)
    steady = (runs - 2 * (runs // 10)) / (high - low) if high > low else done / elapsed
    return {"workers": workers, "runs": runs, "warmup_runs": warm, "warmup_s": warm_s, "done": done,
            "not_succeeded": failed, "seconds": elapsed, "runs_per_s": done / elapsed, "steady_runs_per_s": steady}


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="measured Runs per worker count")
    parser.add_argument("--warmup", type=int, default=10, help="untimed Runs per worker first")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(n, args.runs, args.warmup) for n in args.workers]
    one = next((r for r in results if r["workers"] == 1), None)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        scale = f", {r['steady_runs_per_s'] / one['steady_runs_per_s']:.2f}x one worker" if one else ""
        print(f"{r['workers']} worker(s): {r['done']}/{r['runs']} Runs in {r['seconds']:.1f} s after "
              f"{r['warmup_runs']} warm-up Runs = {r['runs_per_s']:.1f} Runs/s; steady (10-90%) "
              f"{r['steady_runs_per_s']:.1f} Runs/s{scale}; not succeeded: {r['not_succeeded']}")


if __name__ == "__main__":
    main()
