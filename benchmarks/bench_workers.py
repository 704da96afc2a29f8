"""Runs per second with 1, 2 and 4 Celery workers on PostgreSQL (issue 8).

    python benchmarks/bench_workers.py --runs 200
    python benchmarks/bench_workers.py --runs 10 --workers 1 --json        # smoke

For each worker count: a fresh PostgreSQL database (created on the loopback server, dropped after),
a private Redis broker on a free loopback port, N `celery worker --pool=solo` processes, and `--runs`
example-shaped Runs (three tool calls, scripted LLM, everything persisted) submitted at once; the time
from the first submit to the last Run's final state gives Runs per second.
"""

from __future__ import annotations

import argparse
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


def measure(workers: int, runs: int) -> dict[str, Any]:
    """Runs/s for `workers` Celery workers on a fresh PostgreSQL database."""
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
            from harness.config import Settings, build_runtime

            rt = build_runtime(Settings.from_env())  # migrates the fresh database
            app = make_app(env["HARNESS_BROKER_URL"])
            procs = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "harness.celery_app:app", "worker",
                                       "--pool=solo", "-n", f"w{i}@%h", "--without-gossip", "--without-mingle",
                                       "--without-heartbeat", "--loglevel=WARNING"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(workers)]
            time.sleep(3)  # let the workers connect before the clock starts
            started = time.perf_counter()
            ids = []
            for _ in range(runs):
                run, _ = rt.runs.submit({"task": "bench A-1001", "user_id": "alice", "roles": ["support_agent"]})
                app.send_task("harness.drive", args=[run.run_id])
                ids.append(run.run_id)
            with rt.store.engine.connect() as conn:
                while True:
                    done = conn.execute(sa.text("SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'")).scalar()
                    conn.rollback()
                    if done == runs or time.perf_counter() - started > 600:
                        break
                    time.sleep(0.1)
            elapsed = time.perf_counter() - started
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
    return {"workers": workers, "runs": runs, "done": int(done), "seconds": elapsed, "runs_per_s": done / elapsed}


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(n, args.runs) for n in args.workers]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['workers']} worker(s): {r['done']}/{r['runs']} Runs in {r['seconds']:.1f} s = "
              f"{r['runs_per_s']:.1f} Runs/s")


if __name__ == "__main__":
    main()
