"""Where an example-shaped Run spends its time and its disk writes (issue 9's profiling pass).

    python benchmarks/profile_run.py --runs 300                 # wall and CPU time per Run
    python benchmarks/profile_run.py --runs 200 --pyinstrument  # call tree (needs pyinstrument)
    python benchmarks/profile_run.py --runs 300 --by-module     # cProfile self time grouped by package
    python benchmarks/profile_run.py --runs 50 --wal            # SQLite WAL pages, by transaction and by table
    python benchmarks/profile_run.py --runs 500 --components    # wall time by component, no profiler
    python benchmarks/profile_run.py --runs 300 --db-url postgresql+psycopg://postgres@127.0.0.1:5432/bench

The Run is the one bench_vs_langgraph.py measures: the bundled support example's skills, three tool
calls, the scripted LLM, Cedar policy and memory on, a SQLite file in a temporary folder. Warm-up Runs
come first so caches and the memory table are in their steady state.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sqlite3
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
#: bytes SQLite appends to the WAL per page it writes (the page and a 24-byte frame header)
FRAME_OVERHEAD = 24


def runtime(folder: Path, db_url: str | None = None) -> tuple[Any, Callable[[], None]]:
    """The benchmark's runtime and one Run of it (on `db_url` when given, else a SQLite file)."""
    from harness.config import build_runtime
    from harness.examples.support import EXAMPLE_DIR
    from harness.settings import Settings

    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")
    rt = build_runtime(Settings(db=db_url or str(folder / "bench.db"), llm_rules=HERE / "fixtures" / "bench_rules.yaml",
                                data_dir=folder / "data", identities_file=EXAMPLE_DIR / "identities.yaml"))

    def one() -> None:
        result = rt.runs.create_run({"task": "bench A-1001", "user_id": "alice", "roles": ["support_agent"]})
        assert result.state == "SUCCEEDED", result

    return rt, one


def timed(one: Callable[[], None], runs: int) -> str:
    """Median wall time and mean CPU time per Run."""
    walls, cpu = [], time.process_time()
    for _ in range(runs):
        started = time.perf_counter()
        one()
        walls.append(time.perf_counter() - started)
    cpu_ms = (time.process_time() - cpu) / runs * 1000
    return f"median wall {statistics.median(walls) * 1000:.2f} ms, CPU {cpu_ms:.2f} ms per Run ({runs} Runs)"


def by_module(one: Callable[[], None], runs: int) -> str:
    """cProfile self time per Run, grouped by package (sqlalchemy, json, harness modules, ...)."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(runs):
        one()
    profile.disable()
    totals: collections.Counter[str] = collections.Counter()
    for (filename, _line, name), (_cc, _nc, own, _cum, _callers) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        if "site-packages/" in filename:
            key = filename.split("site-packages/")[1].split("/")[0]
        elif "/harness/" in filename:
            key = "harness/" + filename.split("/harness/")[1]
        elif filename == "~":
            key = name
        else:
            key = "stdlib " + Path(filename).name
        totals[key] += own
    whole = sum(totals.values())
    lines = [f"{key[:70]:70s} {own / runs * 1000:7.3f} ms {own / whole * 100:5.1f}%"
             for key, own in totals.most_common(30)]
    # time inside SQLite's C calls: a profiler adds little to these (it times the call, not its insides),
    # so this is close to what the database itself costs a Run with harness's schema, whatever the Python
    inside = {key: own for key, own in totals.items() if "sqlite3." in key}
    commits = sum(own for key, own in inside.items() if "'commit'" in key)
    return "\n".join([*lines, f"total (profiled) {whole / runs * 1000:.2f} ms per Run",
                      f"inside SQLite (statements, fetches and commits): {sum(inside.values()) / runs * 1000:.2f} ms "
                      f"per Run, of which commits {commits / runs * 1000:.2f} ms"])


def wal_pages(rt: Any, one: Callable[[], None], folder: Path, runs: int) -> str:
    """WAL pages written per Run, by the code that opened each transaction (auto-checkpoint off)."""
    engine: sa.Engine = rt.store.engine
    sa.event.listen(engine, "connect", lambda dbapi, _record: dbapi.execute("PRAGMA wal_autocheckpoint=0"))
    engine.dispose()
    conn = sqlite3.connect(folder / "bench.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    conn.close()
    wal = folder / "bench.db-wal"
    written: collections.Counter[str] = collections.Counter()
    state: dict[str, Any] = {"size": wal.stat().st_size if wal.exists() else 0}

    def opener() -> str:
        frames = [f for f in traceback.extract_stack()[:-2] if "/harness/" in f.filename]
        inner = frames[-1].name if frames else "?"
        for frame in reversed(frames):
            if not any(part in frame.filename for part in ("sql/store.py", "sql/database.py")):
                return f"{Path(frame.filename).name}:{frame.name} -> {inner}"
        return inner

    def on_commit(_conn: sa.Connection) -> None:
        state["who"] = opener()

    def on_begin(_conn: sa.Connection) -> None:  # the previous commit's pages are in the WAL by now
        size = wal.stat().st_size if wal.exists() else 0
        if "who" in state:
            written[state.pop("who")] += size - state["size"]
        state["size"] = size

    sa.event.listen(engine, "commit", on_commit)
    sa.event.listen(engine, "begin", on_begin)
    for _ in range(runs):
        one()
    on_begin(None)  # type: ignore[arg-type]
    frame = page + FRAME_OVERHEAD
    lines = [f"{who[:80]:80s} {size / frame / runs:6.1f}" for who, size in written.most_common()]
    return "\n".join(["pages per Run, by transaction:", *lines,
                      f"total {sum(written.values()) / frame / runs:.1f} pages ({page}-byte) per Run",
                      "", "pages per Run, by table or index (page 1 is sqlite_schema's: the file grew):",
                      *wal_btrees(folder, wal, runs)])


def wal_btrees(folder: Path, wal: Path, runs: int) -> list[str]:
    """Which table or index each WAL frame wrote, from the frame headers and SQLite's dbstat table."""
    conn = sqlite3.connect(folder / "bench.db")
    try:
        owner = {int(pageno): str(name) for name, pageno in conn.execute("SELECT name, pageno FROM dbstat")}
    except sqlite3.OperationalError:  # an SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
        return ["(this SQLite has no dbstat table)"]
    finally:
        conn.close()
    data = wal.read_bytes()
    page = int.from_bytes(data[8:12], "big")
    counts: collections.Counter[str] = collections.Counter()
    for offset in range(32, len(data) - FRAME_OVERHEAD + 1, page + FRAME_OVERHEAD):  # 32-byte WAL header
        counts[owner.get(int.from_bytes(data[offset:offset + 4], "big"), "(freed since)")] += 1
    return [f"{name:80s} {n / runs:6.1f}" for name, n in counts.most_common()]


def components(one: Callable[[], None], runs: int) -> str:
    """Wall time per Run in each component, measured with perf_counter around its entry point (no
    profiler, so no profiler's distortion). Nested: a transition includes its commit and, at the close,
    the drain; a step's record includes its commit."""
    from harness.adapters.sql.store import SqlStore
    from harness.drive.state_machine import StateMachine
    from harness.pipeline.context_assembler import ContextAssembler
    from harness.pipeline.gatekeeper import PolicyEngine
    from harness.pipeline.plan_orchestrator import PlanOrchestrator
    from harness.pipeline.run_manager import RunManager
    from harness.pipeline.tool_controller import ToolController

    spent: collections.Counter[str] = collections.Counter()
    originals: list[tuple[Any, str, Any]] = []

    def clock(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started
        setattr(owner, name, timed_call)

    timed_points = (
        (RunManager, "create_run", "the whole Run"),
        (SqlStore, "create_run", "creating the Run (CREATED committed)"),
        (SqlStore, "_compare_and_set", "transitions (compare-and-set transactions)"),
        (SqlStore, "drain_within", "  of which: chaining the outbox at the close"),
        (sa.engine.Transaction, "commit", "commits (every transaction, reads included)"),
        (SqlStore, "save_context", "step records (RunContext + traces, one transaction each)"),
        (ContextAssembler, "assemble", "context assembly (tokenizer, memory recall)"),
        (PlanOrchestrator, "plan", "planning (scripted LLM, plan validation)"),
        (PolicyEngine, "evaluate", "policy (structural, Cedar, budgets, guardrails)"),
        (ToolController, "call", "tool calls (validation, thread hop, skill, ToolTrace)"),
        (StateMachine, "_closing_records", "closing records (RunTrace, memory write-back)"),
        (SqlStore, "outcome_of", "the caller's result, read back"),
    )
    labels = [label for _owner, _name, label in timed_points]
    for owner, name, label in timed_points:
        clock(owner, name, label)
    try:
        for _ in range(runs):
            one()
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)
    whole = spent["the whole Run"]
    return "\n".join(f"{label:62s} {spent[label] / runs * 1000:7.3f} ms {spent[label] / whole * 100:5.1f}%"
                     for label in labels)


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--db-url", help="a database URL to run on instead of a SQLite file (an empty database: "
                                         "e.g. postgresql+psycopg://postgres@127.0.0.1:5432/bench)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--pyinstrument", action="store_true")
    mode.add_argument("--by-module", action="store_true")
    mode.add_argument("--wal", action="store_true")
    mode.add_argument("--components", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rt, one = runtime(folder, args.db_url)
        for _ in range(args.warmup):
            one()
        if args.pyinstrument:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0002)
            profiler.start()
            for _ in range(args.runs):
                one()
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False))
        elif args.by_module:
            print(by_module(one, args.runs))
        elif args.wal:
            print(wal_pages(rt, one, folder, args.runs))
        elif args.components:
            print(components(one, args.runs))
        else:
            print(timed(one, args.runs))
        rt.close()


if __name__ == "__main__":
    main()
