"""I/O-bound load: N Runs at once whose time is spent waiting for a model (issue 37). Not a timed test.

    python benchmarks/bench_io_bound.py --runs 500 --backends sqlite,postgresql --rounds 1
    git worktree add --detach /tmp/head HEAD        # measure a commit, not a working tree being edited:
    python benchmarks/bench_io_bound.py --runs 500 --rounds 3 --celery --src /tmp/head/src --logs /tmp/io-logs
    python benchmarks/bench_io_bound.py --runs 5000 --delay 1 --rounds 3 --out /tmp/io5000.json
    python benchmarks/bench_io_bound.py --runs 5 --delay 0.05 --backends sqlite --no-langgraph --json  # smoke

A fake OpenAI-compatible server on loopback (`fake_openai_server.py`, its own process) answers every chat
completion after `--delay` seconds: a plan calling ONE read-only skill (`orders.lookup`), then an answer
written from its result. So each Run is two model calls and one skill call, and nearly all its time is
waiting. Contenders, each on a fresh database, in the same rounds, in an order rotated each round:

- harness-sqlite, harness-postgresql (harness-mariadb with `--backends … mariadb`): `harness serve` as a
  subprocess with default settings except the database URL and the model (HARNESS_LLM=openai pointed at
  the fake server); the N Runs are POSTed at once over HTTP (`--connections` at a time; a 503/429 is
  retried after its Retry-After and counted);
- celery (`--celery`, PostgreSQL): `harness worker` (its default concurrency, or `-c` from
  `--celery-concurrency`) on a private Redis broker; the Runs are created and queued from this process, as
  `harness.celery_app.submit` does;
- langgraph: plan node -> tool node -> answer node, the model nodes calling the same server with
  httpx.AsyncClient, `graph.ainvoke` for the N inputs under `asyncio.gather`, AsyncPostgresSaver (a psycopg
  pool of `--langgraph-pool`) on the same PostgreSQL server (AsyncSqliteSaver with
  `--langgraph-backend sqlite`), in a process of its own.

Reported per contender and round: wall (first submission to the last Run final), Runs/s, peak model calls
in flight (counted by the fake server), peak Runs driven at once (harness: Runs past CREATED and not final,
sampled from the database; LangGraph: `ainvoke` calls not returned), peak RSS and PSS of the contender's
processes (its process tree, /proc/<pid>/smaps_rollup), peak connections to its database (PostgreSQL's
pg_stat_activity, MariaDB's processlist), CPU seconds per Run (its processes' /proc/<pid>/stat) and
failures by final state and reason (numbers in a reason written N). Then medians over the rounds and, for
every contender, the median of its ratios to LangGraph within a round. `--out` writes it all as JSON.

Every wait has a deadline (`--limit-s` per contender); the fake server and every subprocess are stopped
on the way out, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_vs_langgraph import _fresh_database  # noqa: E402
from bench_workers import _free_port, _wait_port  # noqa: E402
from io_bound_common import (  # noqa: E402
    FINAL,
    MODEL,
    PG_SERVER,
    Database,
    Sampler,
    fresh_mariadb,
    process,
    reason,
    server_stats,
    task,
)
from io_bound_langgraph import run_langgraph  # noqa: E402

API_KEY = "demo-alice-key"  # the support example's demo identity default/alice (support_agent)
METRICS = ("wall_s", "runs_per_s", "peak_model_calls", "peak_runs_driven", "peak_rss_mb", "peak_pss_mb",
           "peak_pg_connections", "cpu_s_per_run", "failures")


# ---------------------------------------------------------------------------- the fake model server

@contextlib.contextmanager
def fake_server(delay: float, folder: Path) -> Iterator[str]:
    """The fake OpenAI-compatible server in its own process; yields its origin (http://127.0.0.1:port)."""
    port = _free_port()
    argv = [sys.executable, str(HERE / "fake_openai_server.py"), "--port", str(port), "--delay", str(delay)]
    with process(argv, log=folder / "fake-server.log"):
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------- harness contenders

#: a harness source tree (its src/ folder) to run instead of the installed one (--src)
SOURCE: list[str] = []
#: a folder the contenders' logs are copied to (--logs)
LOGS: list[Path] = []


def harness_env(db: str, origin: str, folder: Path) -> dict[str, str]:
    """The environment of a harness process: defaults, except the database and the model (the fake server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "OPENAI_"))}
    if SOURCE:
        env["PYTHONPATH"] = os.pathsep.join([*SOURCE, *filter(None, [env.get("PYTHONPATH")])])
    return {**env, "HARNESS_DATABASE_URL": db, "HARNESS_LLM": "openai", "HARNESS_LLM_BASE_URL": f"{origin}/v1",
            "HARNESS_LLM_MODEL": MODEL, "OPENAI_API_KEY": "bench-not-a-key", "HARNESS_DATA_DIR": str(folder / "data"),
            "HARNESS_EXAMPLE_LEDGER": str(folder / "ledger.jsonl"), "NO_PROXY": "127.0.0.1,localhost",
            # where signed checkpoints and their keys would go: the contender's folder, never the user's own
            "HARNESS_CHECKPOINT_DIR": str(folder / "checkpoints"), "HARNESS_CHECKPOINT_KEY_DIR": str(folder / "keys")}


def harness_cli() -> list[str]:
    """The `harness` command of this interpreter."""
    return [sys.executable, "-m", "harness.cli"]


async def _post_all(base: str, runs: int, tag: str, connections: int, deadline: float) -> dict[str, Any]:
    """POST `runs` Runs at once (`connections` at a time); a busy answer (503/429) is retried after its
    Retry-After until the deadline."""
    import httpx

    busy, refused = collections.Counter[str](), collections.Counter[str]()
    # httpx's pool rescans its waiting requests at every change, so thousands of them waiting on it take
    # longer than the Runs: they wait here instead, `connections` at a time
    gate = asyncio.Semaphore(connections)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": API_KEY}, limits=limits, timeout=60,
                                 trust_env=False) as client:
        async def one(i: int) -> str | None:
            body = {"task": task(i), "idempotency_key": f"{tag}-{i}"}
            while time.monotonic() < deadline:
                try:
                    async with gate:
                        answer = await client.post("/api/v1/runs", json=body)
                except httpx.HTTPError as exc:
                    busy[f"{type(exc).__name__}"] += 1
                    await asyncio.sleep(0.5)
                    continue
                if answer.status_code in (200, 201, 202):
                    return str(answer.json()["run_id"])
                if answer.status_code in (429, 503):
                    busy[f"HTTP {answer.status_code}"] += 1
                    await asyncio.sleep(float(answer.headers.get("retry-after") or 1))
                    continue
                refused[reason(f"HTTP {answer.status_code}: {answer.text[:120]}")] += 1
                return None
            refused["not accepted before the deadline"] += 1
            return None

        ids = await asyncio.gather(*(one(i) for i in range(runs)))
    return {"accepted": sum(1 for i in ids if i), "retried": dict(busy), "refused": dict(refused)}


def failures(db: Database, since: float) -> dict[str, int]:
    """Runs created since `since` that did not succeed, by state and reason (the last closing transition's)."""
    rows = db.rows(
        "SELECT r.state, r.close_reason, (SELECT t.reason FROM transitions t WHERE t.run_id = r.run_id AND "
        "t.to_state IN ('FAILED', 'TIMEOUT', 'REJECTED', 'CANCELLED') ORDER BY t.seq DESC LIMIT 1) "
        "FROM runs r WHERE r.created_at >= ? AND r.state <> 'SUCCEEDED'", since)
    found: collections.Counter[str] = collections.Counter()
    for state, close_reason, why in rows:
        if state not in FINAL:
            found[f"{state}: not final at the deadline"] += 1
        else:
            found[f"{state} ({close_reason}): {reason(why or '')}"] += 1
    return dict(found)


def _ended_at(db: Database, since: float) -> float | None:
    row = db.rows(f"SELECT max(last_state_change_at) FROM runs WHERE created_at >= ? AND state IN "
                  f"({', '.join(repr(s) for s in FINAL)})", since)
    return float(row[0][0]) if row and row[0][0] is not None else None


def _await_final(sampler: Sampler, expected: int, deadline: float) -> None:
    while time.monotonic() < deadline and sampler.final < expected:
        time.sleep(0.1)


def _outcome(name: str, runs: int, db: Database, sampler: Sampler, started: float, origin: str,
             extra: dict[str, Any]) -> dict[str, Any]:
    """A harness contender's result once its Runs are final (or the deadline passed)."""
    states = db.states(started)
    ended = _ended_at(db, started) if sum(states.get(s, 0) for s in FINAL) == runs else None
    wall = (ended or time.time()) - started
    failed = failures(db, started)
    not_made = runs - sum(states.values())
    if not_made > 0:
        failed["not accepted"] = not_made
    stats = server_stats(origin)
    used = sampler.report()
    return {"contender": name, "runs": runs, "wall_s": wall, "runs_per_s": runs / wall,
            "succeeded": states.get("SUCCEEDED", 0), "failures": runs - states.get("SUCCEEDED", 0),
            "failed_by_reason": failed, "all_final": ended is not None, "peak_model_calls": stats["peak_in_flight"],
            "model_calls": stats["calls"], "peak_runs_driven": sampler.peak_driven, **used,
            "cpu_s_per_run": used["cpu_s"] / runs, "db_cpu_s_per_run": _per(used["db_cpu_s"], runs), **extra}


def _per(total: float | None, runs: int) -> float | None:
    return None if total is None else total / runs


def run_serve(backend: str, runs: int, origin: str, limit_s: float, tag: str, connections: int,
              workers: int | None, processes: int = 1, name: str = "") -> dict[str, Any]:
    """`harness serve [--processes K]` on a fresh database; N Runs POSTed at once; polled until every one is
    final (all the service's processes measured: the supervisor and its K replicas)."""
    name = name or f"harness-{backend}"
    fresh = fresh_mariadb() if backend == "mariadb" else _fresh_database(backend, PG_SERVER)
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp, fresh as server_db:
        folder = Path(tmp)
        db_url = server_db or str(folder / "harness.db")
        port = _free_port()
        argv = [*harness_cli(), "serve", "--port", str(port), *(["--workers", str(workers)] if workers else []),
                *(["--processes", str(processes)] if processes > 1 else [])]
        try:
            with process(argv, env=harness_env(db_url, origin, folder), cwd=tmp, log=folder / "serve.log") as serve:
                _ready(f"http://127.0.0.1:{port}", serve, folder / "serve.log", processes)
                db = Database(db_url)
                try:
                    server_stats(origin, reset=True)
                    started = time.time()
                    deadline = time.monotonic() + limit_s
                    with Sampler([serve.pid], db, started) as sampler:
                        posted = asyncio.run(_post_all(f"http://127.0.0.1:{port}", runs, tag, connections,
                                                       deadline))
                        submit_s = time.time() - started
                        _await_final(sampler, posted["accepted"], deadline)
                    return _outcome(name, runs, db, sampler, started, origin,
                                    {"submit_s": submit_s, "retried": posted["retried"],
                                     "refused": posted["refused"], "serve_workers": workers or "default",
                                     "serve_processes": processes})
                finally:
                    db.close()
        finally:
            keep_log(folder / "serve.log", f"{name}-{tag}")


def keep_log(log: Path, name: str) -> None:
    """Copy a contender's log to the --logs folder, when one is given."""
    if LOGS and log.exists():
        LOGS[0].mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, LOGS[0] / f"{name}.log")


def _ready(base: str, proc: subprocess.Popen[str], log: Path, processes: int = 1, limit_s: float = 90) -> None:
    """Wait until the service answers /health (it migrates the database first) and, with several processes,
    until every one of them has logged its start."""
    import httpx

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"harness serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", headers={"X-API-Key": API_KEY}, timeout=5, trust_env=False).is_success \
                    and log.read_text().count("Application startup complete") >= processes:
                return
        time.sleep(0.2)
    raise RuntimeError(f"harness serve did not come up in {limit_s:.0f} s: {log.read_text()[-2000:]}")


def run_celery(runs: int, origin: str, limit_s: float, concurrency: int | None) -> dict[str, Any]:
    """A Celery worker (`harness worker [-c C]`) on a fresh PostgreSQL database and a private Redis."""
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp, _fresh_database("postgresql", PG_SERVER) as pg:
        assert pg is not None
        folder, port = Path(tmp), _free_port()
        env = {**harness_env(pg, origin, folder), "HARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0"}
        redis = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", tmp]
        saved = dict(os.environ)
        with process(redis, log=folder / "redis.log"):
            _wait_port(port)
            os.environ.update(env)  # this process creates and queues the Runs, as celery_app.submit does
            try:
                from harness.celery_app import make_app
                from harness.config import build_runtime
                from harness.settings import Settings

                rt = build_runtime(Settings.from_env())  # migrates the fresh database
                app = make_app(env["HARNESS_BROKER_URL"])
                argv = [*harness_cli(), "worker", *(["-c", str(concurrency)] if concurrency else [])]
                with process(argv, env=env, cwd=tmp, log=folder / "worker.log") as worker:
                    db = Database(pg)
                    try:
                        return _drive_celery(rt, app, worker, db, runs, origin, limit_s, concurrency)
                    finally:
                        db.close()
                        rt.close()
                        keep_log(folder / "worker.log", f"celery-{concurrency or 'default'}")
            finally:
                os.environ.clear()
                os.environ.update(saved)


def _drive_celery(rt: Any, app: Any, worker: subprocess.Popen[str], db: Database, runs: int, origin: str,
                  limit_s: float, concurrency: int | None) -> dict[str, Any]:
    def queue(i: int) -> None:
        run, _ = rt.runs.submit({"task": task(i), "user_id": "alice", "roles": ["support_agent"]})
        app.send_task("harness.drive", args=[run.run_id])

    warm = time.time()
    queue(-1)  # the worker's start-up and first Run, not counted
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(db.states(warm).get(s, 0) for s in FINAL) < 1:
        time.sleep(0.2)
    server_stats(origin, reset=True)
    started = time.time()
    with Sampler([worker.pid], db, started) as sampler:
        for i in range(runs):
            queue(i)
        submit_s = time.time() - started
        _await_final(sampler, runs, time.monotonic() + limit_s)
    return _outcome("celery", runs, db, sampler, started, origin,
                    {"submit_s": submit_s, "celery_concurrency": concurrency or "default"})


# ---------------------------------------------------------------------------- rounds and the report

def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every contender once per round, in an order rotated each round, against one fake model server."""
    contenders = [f"harness-{b}" + (f"-x{k}" if k > 1 else "") for b in args.backends for k in args.serve_processes] \
        + (["celery"] if args.celery else []) + \
        ([] if args.no_langgraph else ["langgraph"])
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp, fake_server(args.delay, Path(tmp)) as origin:
        for r in range(args.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            results: dict[str, dict[str, Any]] = {}
            for name in order:
                print(f"round {r + 1}: {name} ...", file=sys.stderr, flush=True)
                try:
                    results[name] = _one(name, args, origin, f"r{r}")
                except Exception as exc:  # one contender's crash is reported, and the others still run
                    results[name] = {"contender": name, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
            rounds.append(results)
    return summarise(rounds, vars(args), contenders)


def _one(name: str, args: argparse.Namespace, origin: str, tag: str) -> dict[str, Any]:
    if name.startswith("harness-"):
        backend, _, processes = name.removeprefix("harness-").partition("-x")
        return run_serve(backend, args.runs, origin, args.limit_s, tag, args.connections, args.serve_workers,
                         int(processes or 1), name)
    if name == "celery":
        return run_celery(args.runs, origin, args.limit_s, args.celery_concurrency)
    return run_langgraph(args.runs, origin, args.limit_s, args.langgraph_backend, args.langgraph_pool)


def summarise(rounds: list[dict[str, dict[str, Any]]], settings: dict[str, Any],
              contenders: list[str]) -> dict[str, Any]:
    """Medians over the rounds, and each contender's ratios to LangGraph within a round (their median)."""
    medians: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, float]] = {}
    for name in contenders:
        done = [r[name] for r in rounds if "error" not in r.get(name, {"error": 1})]
        if done:
            medians[name] = {k: statistics.median(float(d[k]) for d in done) for k in METRICS}
        paired = [(r[name], r["langgraph"]) for r in rounds if name != "langgraph"
                  and "error" not in r.get(name, {"error": 1}) and "error" not in r.get("langgraph", {"error": 1})]
        if paired:
            ratios[f"{name}/langgraph"] = {k: statistics.median(a[k] / b[k] for a, b in paired if b[k])
                                           for k in ("wall_s", "peak_rss_mb", "peak_pss_mb", "cpu_s_per_run")
                                           if any(b[k] for _, b in paired)}
    keep = ("src", "runs", "delay", "rounds", "backends", "celery", "celery_concurrency", "connections",
            "serve_workers", "serve_processes", "langgraph_backend", "langgraph_pool", "limit_s")
    return {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
            "settings": {k: settings[k] for k in keep if k in settings}, "rounds": rounds, "medians": medians,
            "ratios": ratios}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def table(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    s = report["settings"]
    lines = [f"{s['runs']} Runs at once, model delay {s['delay']:g} s, {len(report['rounds'])} round(s), "
             f"{report['cores']} cores, {report['date']}", "",
             "| round | contender | wall s | Runs/s | model calls in flight (peak) | Runs driven at once (peak) | "
             "peak RSS MB | peak PSS MB | PG connections (peak) | CPU/Run | PG server CPU/Run | failures |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, results in enumerate(report["rounds"], 1):
        for name, r in results.items():
            if "error" in r:
                lines.append(f"| {i} | {name} | error: {r['error'][-300:]} |" + " |" * 10)
                continue
            lines.append(f"| {i} | {name} | {r['wall_s']:.1f} | {r['runs_per_s']:.1f} | {r['peak_model_calls']} | "
                         f"{r['peak_runs_driven']} | {r['peak_rss_mb']:.0f} | {r['peak_pss_mb']:.0f} | "
                         f"{r['peak_pg_connections']} | {r['cpu_s_per_run'] * 1000:.1f} ms | "
                         f"{_ms(r.get('db_cpu_s_per_run'))} | {r['failures']} of {r['runs']} |")
    if report["ratios"]:
        lines += ["", "| ratio to LangGraph (median within rounds) | wall | peak RSS | peak PSS | CPU/Run |",
                  "|---|---|---|---|---|"]
        for name, r in report["ratios"].items():
            cells = [f"{r[k]:.2f}" if k in r else "-" for k in ("wall_s", "peak_rss_mb", "peak_pss_mb",
                                                                 "cpu_s_per_run")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    reasons = [(i, name, why, n) for i, results in enumerate(report["rounds"], 1)
               for name, r in results.items() for why, n in r.get("failed_by_reason", {}).items()]
    if reasons:
        lines += ["", "Failures by final state and reason:", ""]
        lines += [f"- round {i}, {name}: {n} x {why}" for i, name, why, n in reasons]
    return "\n".join(lines)


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500, help="Runs submitted at once per contender")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the fake model takes per call")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every contender (order rotated)")
    parser.add_argument("--backends", type=lambda v: [b for b in v.split(",") if b], default=["sqlite", "postgresql"],
                        help="harness serve's databases, comma-separated: sqlite, postgresql, mariadb")
    parser.add_argument("--celery", action="store_true", help="also a Celery worker on PostgreSQL")
    parser.add_argument("--celery-concurrency", type=int,
                        help="harness worker -c N (default: the worker's own; 32 is the issue's prefork setup)")
    parser.add_argument("--no-langgraph", action="store_true", help="leave LangGraph out")
    parser.add_argument("--langgraph-backend", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--langgraph-pool", type=int, default=10, help="LangGraph's psycopg pool (max size)")
    parser.add_argument("--connections", type=int, default=100, help="HTTP connections the submitter opens")
    parser.add_argument("--serve-processes", type=lambda v: [int(k) for k in v.split(",") if k], default=[1],
                        help="harness serve --processes, one contender per value per backend (e.g. 1,2)")
    parser.add_argument("--serve-workers", type=int, help="harness serve --workers (default: the service's)")
    parser.add_argument("--limit-s", type=float, default=600, help="deadline per contender, seconds")
    parser.add_argument("--src", help="a harness source tree (its src/ folder) to measure instead of the installed "
                        "one, e.g. a worktree of a commit: git worktree add /tmp/head HEAD; --src /tmp/head/src")
    parser.add_argument("--logs", help="copy each contender's log (harness serve's, the Celery worker's) here")
    parser.add_argument("--out", help="write the report as JSON to this file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of Markdown")
    args = parser.parse_args()
    # a SIGTERM unwinds like an exception, so every subprocess and database is still ended on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unknown = set(args.backends) - {"sqlite", "postgresql", "mariadb"}
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    if args.src:
        SOURCE.append(str(Path(args.src).resolve()))
        sys.path.insert(0, SOURCE[0])  # the Celery contender creates its Runs in this process
    if args.logs:
        LOGS.append(Path(args.logs))
    report = measure(args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2) if args.json else table(report))


if __name__ == "__main__":
    main()
