"""Client instructions per Run, counted by valgrind (callgrind): unlike time, the count does not move with
the machine's load, so a change worth a few percent shows up on a shared 2-core machine.

    python benchmarks/instructions_per_run.py                          # SQLite file
    python benchmarks/instructions_per_run.py --db-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    python benchmarks/instructions_per_run.py --src /tmp/base/src       # another source tree (a baseline)
    python benchmarks/instructions_per_run.py --contender langgraph    # LangGraph's Run of bench_vs_langgraph.py
    python benchmarks/instructions_per_run.py --by-object              # and where they go: the interpreter, SQLite…
    python benchmarks/instructions_per_run.py --db-url mysql+pymysql://root@127.0.0.1:3306/test --memory 1000

One process makes `--warmup` untimed Runs (imports, caches, the tokenizer's vocabulary) and then `--runs`
Runs of `profile_run.py`'s benchmark Run (or, with `--contender langgraph`, of the same Run as
bench_vs_langgraph.py's LangGraph graph with its SqliteSaver or PostgresSaver, durability "async" unless
`--durability sync`); another the same with `--more` Runs more. The difference of
their totals divided by `--more` is what one steady-state Run costs, start-up and warm-up cancelled out.
On PostgreSQL each process gets a fresh database of its own (the server's work is not counted: it is
another process).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: the server's `test` database only creates and drops the processes' own
SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _child(runs: int, warmup: int, db_url: str | None, contender: str, durability: str, memory: int = 0) -> None:
    """Inside valgrind: warm up, then make `runs` Runs."""
    sys.path.insert(0, str(HERE))
    if contender == "langgraph":
        from bench_vs_langgraph import _langgraph

        with tempfile.TemporaryDirectory() as tmp:
            _langgraph(warmup + runs, Path(tmp), False, "NORMAL", durability, db_url)
        return
    from profile_run import runtime

    with tempfile.TemporaryDirectory() as tmp:
        rt, one = runtime(Path(tmp), db_url)
        if memory:
            _remember(rt, memory)
        for _ in range(warmup + runs):
            one()
        rt.close()


def _remember(rt: Any, entries: int) -> None:
    """`entries` summaries in the benchmark user's memory, each sharing words with the Run's task (so a recall
    ranks them all: the window full, as after that many Runs of one user)."""
    import random

    from harness.adapters.sql.memory import SqlMemoryRows
    from harness.context.secrets import SecretFilter
    from harness.memory.store import MemoryStore, NewMemory

    words = [f"word{i}" for i in range(2000)] + ["bench", "order", "status", "refund"]
    pick = random.Random(entries)
    memory = MemoryStore(SqlMemoryRows(rt.store.engine), rt.store.clock, SecretFilter())
    for first in range(0, entries, 500):
        memory.add([NewMemory(tenant_id="default", scope="user", user_id="alice", kind="summary",
                              content=f"bench A-{i}: " + " ".join(pick.choice(words) for _ in range(20)))
                    for i in range(first, min(first + 500, entries))])


def _fresh_database(server: str, name: str) -> str:
    """A new, empty database `name` on `server` (its URL): the URL of it."""
    _on_server(server, f"DROP DATABASE IF EXISTS {_quoted(server, name)}", f"CREATE DATABASE {_quoted(server, name)}")
    return server.rsplit("/", 1)[0] + "/" + name


def _quoted(server: str, name: str) -> str:
    """`name` quoted as an identifier for `server`'s dialect (MySQL/MariaDB: backticks)."""
    return f"`{name}`" if server.startswith(("mysql", "mariadb")) else f'"{name}"'


def _on_server(server: str, *statements: str) -> None:
    """Run `statements` in autocommit on `server` (CREATE and DROP DATABASE run outside a transaction)."""
    import sqlalchemy as sa

    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))
    engine.dispose()


def _by_object(out: Path) -> collections.Counter[str]:
    """Self instructions per shared object (the interpreter, libsqlite3, libpq, orjson…) of a callgrind
    output, as callgrind_annotate lists them."""
    listed = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", "--show-percs=no", str(out)],
                            capture_output=True, text=True, check=True).stdout
    totals: collections.Counter[str] = collections.Counter()
    for line in listed.splitlines():
        found = _ANNOTATED.match(line)
        if found is not None:
            totals[Path(found.group(2)).name] += int(found.group(1).replace(",", ""))
    return totals


#: a line of callgrind_annotate's function list: `1,234  file:function [/path/to/object.so]`
_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+.*\[(.+)\]\s*$")


def _count(runs: int, args: argparse.Namespace) -> tuple[int, collections.Counter[str]]:
    """Instructions of a process making `warmup + runs` Runs (all its threads together), and, with
    `--by-object`, how they divide among shared objects."""
    name = f"instructions_{os.getpid()}_{runs}"
    db_url = _fresh_database(args.db_url, name) if args.db_url else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (args.src, os.environ.get("PYTHONPATH")) if p))
    try:
        return _counted(runs, args, db_url, env)
    finally:  # the counted process has ended: its database is dropped, not left on the server
        if args.db_url:
            _on_server(args.db_url, f"DROP DATABASE IF EXISTS {_quoted(args.db_url, name)}")


def _counted(runs: int, args: argparse.Namespace, db_url: str | None,
             env: dict[str, str]) -> tuple[int, collections.Counter[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
                   "--child", str(runs), "--warmup", str(args.warmup), "--contender", args.contender,
                   "--durability", args.durability, "--memory", str(args.memory)]
        if db_url:
            command += ["--db-url", db_url]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the counted process failed:\n{done.stderr[-3000:]}")
        found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"valgrind printed no total:\n{done.stderr[-3000:]}")
        return int(found.group(1)), _by_object(out) if args.by_object else collections.Counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="Runs after the warm-up in the first process")
    parser.add_argument("--more", type=int, default=30, help="Runs more in the second process")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--db-url", help="a PostgreSQL or MySQL/MariaDB server URL (a database of its own is made "
                                          "per process)")
    parser.add_argument("--memory", type=int, default=0,
                        help="summaries in the Run's user's memory before the warm-up (a recall ranks them)")
    parser.add_argument("--src", help="put this source tree first on the path (the code before a change)")
    parser.add_argument("--contender", choices=("harness", "langgraph"), default="harness")
    parser.add_argument("--durability", choices=("async", "sync"), default="async",
                        help="LangGraph's checkpoint durability (--contender langgraph)")
    parser.add_argument("--by-object", action="store_true", help="also per shared object, per Run")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.warmup, args.db_url, args.contender, args.durability, args.memory)
        return
    if args.db_url == "":
        args.db_url = SERVER
    (fewer, objects_fewer), (more, objects_more) = _count(args.runs, args), _count(args.runs + args.more, args)
    per_run = (more - fewer) / args.more
    who = (args.src or "this source tree") if args.contender == "harness" else f"langgraph, {args.durability}"
    backend = "SQLite" if not args.db_url else "MySQL/MariaDB" if args.db_url.startswith("mysql") else "PostgreSQL"
    memory = f", {args.memory} memory entries" if args.memory else ""
    print(f"{per_run / 1e6:.2f} M instructions per Run ({backend}{memory}, "
          f"{who}; {fewer:,} for {args.runs} Runs, {more:,} for {args.runs + args.more})")
    if args.by_object:
        objects_more.subtract(objects_fewer)
        for name, count in objects_more.most_common(12):
            print(f"  {count / args.more / 1e6:6.2f} M  {name}")


if __name__ == "__main__":
    main()
