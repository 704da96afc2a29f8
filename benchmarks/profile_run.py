"""Where an example-shaped Run spends its time and its disk writes (issue 9's profiling pass).

    python benchmarks/profile_run.py --runs 300                 # wall and CPU time per Run
    python benchmarks/profile_run.py --runs 200 --pyinstrument  # call tree (needs pyinstrument)
    python benchmarks/profile_run.py --runs 300 --by-module     # cProfile self time grouped by package
    python benchmarks/profile_run.py --runs 50 --wal            # SQLite WAL pages each transaction writes

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


def runtime(folder: Path) -> tuple[Any, Callable[[], None]]:
    """The benchmark's runtime and one Run of it."""
    from harness.config import Settings, build_runtime
    from harness.examples.support import EXAMPLE_DIR

    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")
    rt = build_runtime(Settings(db=str(folder / "bench.db"), llm_rules=HERE / "fixtures" / "bench_rules.yaml",
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
    return "\n".join([*lines, f"total (profiled) {whole / runs * 1000:.2f} ms per Run"])


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
                      f"total {sum(written.values()) / frame / runs:.1f} pages ({page}-byte) per Run"])


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=200)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--pyinstrument", action="store_true")
    mode.add_argument("--by-module", action="store_true")
    mode.add_argument("--wal", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rt, one = runtime(folder)
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
        else:
            print(timed(one, args.runs))
        rt.close()


if __name__ == "__main__":
    main()
