"""harness-kernel side by side with LangGraph and a plain-sqlite3 floor, in one run (issue 9).

    python benchmarks/bench_vs_langgraph.py --runs 300            # full table
    python benchmarks/bench_vs_langgraph.py --runs 5 --json        # smoke

Contenders, each in its own fresh process (so peak memory and bytes on disk are its own), each doing
the same work: a Run shaped like the bundled example — prepare, plan, policy, three tool calls
(the example's own skill functions), finish:

- harness:        the real pipeline on a SQLite file (scripted LLM, Cedar policy, every transition
                  persisted with its audit, projection and hash-chained trace records);
- harness-hitl:   the same with one human approval (park in AWAITING_HITL, decide, resume);
- langgraph:      the same graph in LangGraph with its durable SqliteSaver checkpointer;
- langgraph-hitl: the same with one `interrupt()` and resume;
- langgraph-sync: LangGraph with durability="sync": each checkpoint is written before the next step
                  starts, as harness records a step before the next one (T6); LangGraph's default,
                  "async", writes it while the next step already runs;
- floor:          plain sqlite3 doing harness's inserts for a Run, one commit per transition,
                  with the chain's SHA-256 per record — the cost of the persistence alone;
- plain:          the same three skill functions called directly, no persistence — the work itself,
                  so harness - plain is the harness's own overhead per Run (issue 3).

Reported: per-Run median and p99 wall time, Runs/s, bytes on disk per Run, peak RSS, and ratios. Each
contender first makes `--warmup` Runs that are not timed (imports, caches, the tokenizer's vocabulary,
LangGraph's first compile): the numbers are its steady state. Bytes per Run count every Run made.

Every SQLite file is opened with the same durability, `--synchronous` (default NORMAL: a commit survives
a crash of the process, not of the machine; FULL: it survives power loss, at one fsync per commit).
`--synchronous defaults` leaves each contender its own default instead: harness NORMAL, LangGraph's
SqliteSaver sqlite3's FULL, which is not a like-for-like comparison (an fsync costs ~0.2 ms here).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONTENDERS = ("harness", "harness-hitl", "langgraph", "langgraph-hitl", "langgraph-sync", "floor", "plain")
#: harness from another source tree (--baseline-src): the code before a change, measured in the same run
BASELINES = ("harness-base", "harness-hitl-base")
#: the loopback PostgreSQL server (trust authentication); its database `test` is only used to create and drop
#: the contenders' own and to read the server's statistics
PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# ---------------------------------------------------------------------------- contenders (child side)

def _pragma(conn: sqlite3.Connection, synchronous: str) -> None:
    """Open a contender's own sqlite3 connection as harness opens its files (WAL, `synchronous`)."""
    conn.execute("PRAGMA journal_mode=WAL")
    if synchronous != "defaults":
        conn.execute(f"PRAGMA synchronous={synchronous}")


def _synchronous_of(conn: Any) -> str:
    """The synchronous level a connection really runs with."""
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[int(conn.execute("PRAGMA synchronous").fetchone()[0])]


def _harness(runs: int, folder: Path, hitl: bool, db_url: str | None = None, count: int = 0) -> list[float]:
    import harness
    from harness.config import build_runtime
    from harness.examples.support import EXAMPLE_DIR
    from harness.settings import Settings

    EFFECTIVE["source"] = str(Path(harness.__file__).resolve().parents[1])
    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")
    rt = build_runtime(Settings(db=db_url or str(folder / "bench.db"),
                                llm_rules=HERE / "fixtures" / "bench_rules.yaml",
                                data_dir=folder / "data", identities_file=EXAMPLE_DIR / "identities.yaml"))
    alice = rt.identities.resolve("alice")
    task = "bench-hitl A-1001" if hitl else "bench A-1001"
    with rt.store.engine.connect() as conn:
        EFFECTIVE["synchronous"] = (_synchronous_of(conn.connection) if db_url is None
                                    else _pg_synchronous(conn.connection.driver_connection))
    if db_url is not None:
        EFFECTIVE["live_before"] = _pg_live_size(db_url)
        EFFECTIVE["size_before"] = _pg_size(rt.store.engine)
    else:  # the migrated schema's own pages (~380 KB of tables and indexes) are not the Runs'
        EFFECTIVE["live_before"] = _sqlite_live_size(folder / "bench.db")

    def one(i: int) -> None:
        # one user, as real callers repeat; HITL Runs get their own requester (approval rate limit)
        user = f"user{i}" if hitl else "alice"
        result = rt.runs.create_run({"task": task, "user_id": user, "roles": ["support_agent"]})
        if hitl:
            approver = alice.model_copy(update={"user_id": f"user{i}"})
            _, result = rt.runs.decide(result.approval_request_id or "", approver, "approve")
        assert result.state == "SUCCEEDED", result

    times = []
    for i in range(runs):
        started = time.perf_counter()
        one(i)
        times.append(time.perf_counter() - started)
    if count:
        from sql_counts import on_harness_engine

        with on_harness_engine(rt.store.engine) as (log, totals):
            for i in range(runs, runs + count - 1):
                one(i)
            last = log.mark()
            one(runs + count - 1)  # the profile of one Run: its transactions, in order
        EFFECTIVE["counts"] = _per_run(totals, count)
        EFFECTIVE["profile"] = [{"caller": t.label, "statements": len(t.statements), "round_trips": t.round_trips,
                                 "end": t.end, "what": t.brief()} for t in log.transactions[last:]]
    if db_url is not None:
        EFFECTIVE["size_after"] = _pg_size(rt.store.engine)
    rt.close()
    return times


def _pg_synchronous(conn: Any) -> str:
    """PostgreSQL's durability for a (psycopg) connection: synchronous_commit and fsync."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('synchronous_commit') AS s, current_setting('fsync') AS f")
        row = cur.fetchone()
    if not conn.autocommit:
        conn.rollback()
    sync, fsync = (row["s"], row["f"]) if isinstance(row, dict) else row
    return f"synchronous_commit={sync}, fsync={fsync}"


def _pg_size(engine: Any) -> int:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar())


def _per_run(totals: dict[str, int], count: int) -> dict[str, float]:
    return {k: v / count for k, v in totals.items()}


def _example_graph(folder: Path, hitl: bool) -> Any:
    """The bundled example's shape as a LangGraph graph (uncompiled), calling the example's own skills."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    sys.path.insert(0, str(Path(__import__("harness.examples.support", fromlist=["x"]).EXAMPLE_DIR) / "skills"))
    import support_skills as skills  # the example's own skill functions: the same work

    from harness.skills.manifests import SkillContext

    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")

    class State(TypedDict, total=False):
        task: str
        plan: list[str]
        outputs: dict[str, Any]
        answer: str

    def ctx(step: str, thread: str) -> SkillContext:
        return SkillContext(run_id=thread, step_id=step, idempotency_key=f"{thread}:{step}", tenant_id="default",
                            user_id="alice", workdir=folder)

    def prepare(state: State) -> State:
        return {"outputs": {}}

    def plan(state: State) -> State:
        return {"plan": ["lookup", "second", "third"]}

    def policy(state: State) -> State:
        return {}

    def approval(state: State) -> State:
        interrupt({"actions": state["plan"]})
        return {}

    def lookup(state: State) -> State:
        return {"outputs": {**state["outputs"], "order": skills.lookup_order({"order_id": "A-1001"},
                                                                             ctx("lookup", state["task"]))}}

    def second(state: State) -> State:
        out = state["outputs"]
        if hitl:
            value = skills.draft_refund({"order": out["order"], "amount": 10}, ctx("draft", state["task"]))
            return {"outputs": {**out, "refund": value}}
        value = skills.lookup_customer({"customer_id": out["order"]["customer_id"]}, ctx("customer", state["task"]))
        return {"outputs": {**out, "customer": value}}

    def third(state: State) -> State:
        out = state["outputs"]
        if hitl:
            value = skills.issue_refund({"order_id": "A-1001", "amount": 10}, ctx("issue", state["task"]))
        else:
            value = skills.add_note({"order_id": "A-1001", "text": "status asked"}, ctx("note", state["task"]))
        return {"outputs": {**out, "third": value}}

    def finish(state: State) -> State:
        return {"answer": "done"}

    graph = StateGraph(State)
    order = [("prepare", prepare), ("plan", plan), ("policy", policy)]
    order += [("approval", approval)] if hitl else []
    order += [("lookup", lookup), ("second", second), ("third", third), ("finish", finish)]
    for name, fn in order:
        graph.add_node(name, fn)
    names = [START, *(n for n, _ in order), END]
    for a, b in itertools.pairwise(names):
        graph.add_edge(a, b)
    return graph


def _langgraph(runs: int, folder: Path, hitl: bool, synchronous: str, durability: str = "async",
               db_url: str | None = None, count: int = 0) -> list[float]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    graph = _example_graph(folder, hitl)
    pg: Any = None
    if db_url is None:
        conn: Any = sqlite3.connect(folder / "langgraph.db", check_same_thread=False)
        _pragma(conn, synchronous)
        EFFECTIVE["synchronous"] = _synchronous_of(conn)
        saver: Any = SqliteSaver(conn)
        saver.setup()
        EFFECTIVE["live_before"] = _sqlite_live_size(folder / "langgraph.db")
    else:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        # exactly what PostgresSaver.from_conn_string opens (its default: no pipeline)
        pg = conn = Connection.connect(_libpq(db_url), autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(conn)
        saver.setup()
        EFFECTIVE["synchronous"] = _pg_synchronous(conn)
        EFFECTIVE["live_before"] = _pg_live_size(db_url)
        EFFECTIVE["size_before"] = _pg_size_of(conn)
    app = graph.compile(checkpointer=saver)

    def one() -> None:
        thread = str(uuid.uuid4())
        config = {"configurable": {"thread_id": thread}}
        result = app.invoke({"task": thread}, config, durability=durability)
        if hitl:
            result = app.invoke(Command(resume={"approved": True}), config, durability=durability)
        assert result["answer"] == "done"

    times = []
    for _ in range(runs):
        started = time.perf_counter()
        one()
        times.append(time.perf_counter() - started)
    if count:
        from sql_counts import PgTrace, SqliteCounts

        counter: Any = SqliteCounts() if pg is None else PgTrace()
        counter.attach(conn)
        for _ in range(count):
            one()
        time.sleep(0.2)  # durability="async": let the last checkpoint's write finish while counted
        EFFECTIVE["counts"] = _per_run(counter.detach(), count)
    if pg is not None:
        EFFECTIVE["size_after"] = _pg_size_of(conn)
    conn.close()
    return times


def _libpq(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://…) as libpq takes it (postgresql://…)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _pg_live_size(url: str) -> int:
    """The database's size after VACUUM FULL (every table rewritten without its dead row versions)."""
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("VACUUM FULL")
        return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def _sqlite_live_size(path: Path) -> int:
    """The pages a SQLite database uses (page_count less its free pages, WAL included): what its rows and
    indexes take, without the pages deleted rows freed for reuse (SQLite has no dead row versions; a freed
    page is reused by the next insert). The counterpart of PostgreSQL's size after VACUUM FULL."""
    with sqlite3.connect(path) as conn:
        used = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int(used * conn.execute("PRAGMA page_size").fetchone()[0])


def _pg_size_of(conn: Any) -> int:
    row = conn.execute("SELECT pg_database_size(current_database()) AS size").fetchone()
    return int(row["size"] if isinstance(row, dict) else row[0])


def _plain(runs: int, folder: Path) -> list[float]:
    """The example's three calls as plain function calls: no kernel, no policy, no persistence."""
    sys.path.insert(0, str(Path(__import__("harness.examples.support", fromlist=["x"]).EXAMPLE_DIR) / "skills"))
    import support_skills as skills

    from harness.skills.manifests import SkillContext

    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")
    times = []
    for i in range(runs):
        ctx = SkillContext(run_id=str(i), step_id="s", idempotency_key=f"{i}:s", tenant_id="default",
                           user_id="alice", workdir=folder)
        started = time.perf_counter()
        order = skills.lookup_order({"order_id": "A-1001"}, ctx)
        customer = skills.lookup_customer({"customer_id": order["customer_id"]}, ctx)
        skills.add_note({"order_id": "A-1001", "text": "status asked"}, ctx)
        answer = f"Order {order['order_id']} for {customer['name']} is {order['status']}."
        times.append(time.perf_counter() - started)
        assert answer
    return times


def _chain(rows: list[Any], seq: int, prev: str) -> tuple[list[tuple[Any, ...]], int, str]:
    """The floors' hash chain over outbox rows (id, record_id, run_id, payload): the rows to insert into
    `trace`, and the new chain head."""
    chained = []
    for _, record_id, rid, body in rows:
        seq += 1
        digest = hashlib.sha256(json.dumps([seq, record_id, rid, "r", prev, body]).encode()).hexdigest()
        chained.append((seq, record_id, rid, body, prev, digest))
        prev = digest
    return chained, seq, prev


def _floor(runs: int, folder: Path, records_per_run: int, transitions_per_run: int, synchronous: str) -> list[float]:
    """Plain sqlite3: the same tables' inserts per Run, one commit per transition, SHA-256 per record, the
    close chaining the outbox in its own transaction and time-ordered ids, as harness does."""
    from harness.domain.ids import ordered_id

    conn = sqlite3.connect(folder / "floor.db", isolation_level=None)
    _pragma(conn, "NORMAL" if synchronous == "defaults" else synchronous)  # harness's own default
    EFFECTIVE["synchronous"] = _synchronous_of(conn)
    conn.executescript("""
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT, version INT, request TEXT, context TEXT);
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT, snapshot TEXT);
        CREATE TABLE transitions (id INTEGER PRIMARY KEY, run_id TEXT, seq INT, from_state TEXT, to_state TEXT,
                                  at REAL);
        CREATE TABLE outbox (id INTEGER PRIMARY KEY, record_id TEXT UNIQUE, run_id TEXT, kind TEXT, payload TEXT);
        CREATE TABLE trace (seq INTEGER PRIMARY KEY, record_id TEXT UNIQUE, run_id TEXT, payload TEXT,
                            prev_hash TEXT, hash TEXT);
        CREATE INDEX trace_run ON trace (run_id);
        CREATE TRIGGER trace_linear BEFORE INSERT ON trace
            WHEN NEW.prev_hash IS NOT (SELECT hash FROM trace WHERE seq = NEW.seq - 1) AND NEW.seq > 1
            BEGIN SELECT RAISE(ABORT, 'fork'); END;
    """)
    per_commit = max(1, records_per_run // transitions_per_run)
    payload = json.dumps({"k": "x" * 200})
    prev, seq, times = "0" * 64, 0, []
    for _ in range(runs):
        started = time.perf_counter()
        run_id = ordered_id()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO runs VALUES (?, 'CREATED', 0, ?, NULL)", (run_id, payload))
        conn.execute("INSERT INTO jobs VALUES (?, 'pending', 'CREATED')", (run_id,))
        conn.execute("COMMIT")
        for n in range(transitions_per_run):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE runs SET state = ?, version = ?, context = ? WHERE run_id = ? AND version = ?",
                         (f"S{n}", n + 1, payload, run_id, n))
            conn.execute("INSERT INTO transitions (run_id, seq, from_state, to_state, at) VALUES (?, ?, ?, ?, ?)",
                         (run_id, n + 1, f"S{n - 1}", f"S{n}", time.time()))
            conn.execute("UPDATE jobs SET status = 'running', snapshot = ? WHERE job_id = ?", (f"S{n}", run_id))
            conn.executemany("INSERT INTO outbox (record_id, run_id, kind, payload) VALUES (?, ?, 'r', ?)",
                             [(ordered_id(), run_id, payload) for _ in range(per_commit)])
            if n < transitions_per_run - 1:
                conn.execute("COMMIT")
        # the last transition (the close) chains the outbox in its own transaction, as harness does
        rows = conn.execute("SELECT id, record_id, run_id, payload FROM outbox ORDER BY id").fetchall()
        chained, seq, prev = _chain(rows, seq, prev)
        conn.executemany("INSERT INTO trace VALUES (?, ?, ?, ?, ?, ?)", chained)
        conn.execute("DELETE FROM outbox")
        conn.execute("COMMIT")
        times.append(time.perf_counter() - started)
    conn.close()
    return times


def _floor_pg(runs: int, db_url: str, records_per_run: int, transitions_per_run: int) -> list[float]:
    """The floor on PostgreSQL: plain psycopg doing the SQLite floor's statements, one commit per transition
    (each a WAL flush), the same linear-chain check as a trigger, the close chaining the outbox."""
    import psycopg

    from harness.domain.ids import ordered_id

    conn = psycopg.connect(_libpq(db_url))
    conn.execute("""
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT, version INT, request TEXT, context TEXT);
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT, snapshot TEXT);
        CREATE TABLE transitions (id BIGSERIAL PRIMARY KEY, run_id TEXT, seq INT, from_state TEXT, to_state TEXT,
                                  at DOUBLE PRECISION);
        CREATE TABLE outbox (id BIGSERIAL PRIMARY KEY, record_id TEXT UNIQUE, run_id TEXT, kind TEXT, payload TEXT);
        CREATE TABLE trace (seq BIGINT PRIMARY KEY, record_id TEXT UNIQUE, run_id TEXT, payload TEXT,
                            prev_hash TEXT, hash TEXT);
        CREATE INDEX trace_run ON trace (run_id);
        CREATE FUNCTION trace_linear() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.seq > 1 AND NEW.prev_hash IS DISTINCT FROM (SELECT hash FROM trace WHERE seq = NEW.seq - 1) THEN
                RAISE EXCEPTION 'fork';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER trace_linear BEFORE INSERT ON trace FOR EACH ROW EXECUTE FUNCTION trace_linear();
    """)
    conn.commit()
    EFFECTIVE["synchronous"] = _pg_synchronous(conn)
    EFFECTIVE["live_before"] = _pg_live_size(db_url)
    EFFECTIVE["size_before"] = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])
    conn.commit()
    per_commit = max(1, records_per_run // transitions_per_run)
    payload = json.dumps({"k": "x" * 200})
    prev, seq, times = "0" * 64, 0, []
    for _ in range(runs):
        started = time.perf_counter()
        run_id = ordered_id()
        conn.execute("INSERT INTO runs VALUES (%s, 'CREATED', 0, %s, NULL)", (run_id, payload))
        conn.execute("INSERT INTO jobs VALUES (%s, 'pending', 'CREATED')", (run_id,))
        conn.commit()
        for n in range(transitions_per_run):
            conn.execute("UPDATE runs SET state = %s, version = %s, context = %s WHERE run_id = %s AND version = %s",
                         (f"S{n}", n + 1, payload, run_id, n))
            conn.execute("INSERT INTO transitions (run_id, seq, from_state, to_state, at) VALUES (%s, %s, %s, %s, %s)",
                         (run_id, n + 1, f"S{n - 1}", f"S{n}", time.time()))
            conn.execute("UPDATE jobs SET status = 'running', snapshot = %s WHERE job_id = %s", (f"S{n}", run_id))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO outbox (record_id, run_id, kind, payload) VALUES (%s, %s, 'r', %s)",
                                [(ordered_id(), run_id, payload) for _ in range(per_commit)])
            if n < transitions_per_run - 1:
                conn.commit()
        rows = conn.execute("SELECT id, record_id, run_id, payload FROM outbox ORDER BY id").fetchall()
        chained, seq, prev = _chain(rows, seq, prev)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO trace VALUES (%s, %s, %s, %s, %s, %s)", chained)
        conn.execute("DELETE FROM outbox")
        conn.commit()
        times.append(time.perf_counter() - started)
    EFFECTIVE["size_after"] = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])
    conn.close()
    return times


def _folder_bytes(folder: Path, suffixes: tuple[str, ...]) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes))


#: what the contender in this process really ran with (read back from its connection)
EFFECTIVE: dict[str, str] = {}


def child(contender: str, runs: int, folder: Path, shape: dict[str, int], synchronous: str,
          warmup: int = 0, db_url: str | None = None, count: int = 0) -> dict[str, Any]:
    """Run one contender in this (fresh) process and report its numbers (the warm-up Runs untimed, then
    `count` Runs untimed with every statement counted). `db_url`: a PostgreSQL database of its own."""
    runs += warmup  # every Run made, the untimed first ones included
    if synchronous != "defaults":
        os.environ["HARNESS_SQLITE_SYNCHRONOUS"] = synchronous
    else:
        os.environ.pop("HARNESS_SQLITE_SYNCHRONOUS", None)
    if contender in ("plain", "floor"):
        count = 0  # nothing of theirs to count (plain) or counted by construction (floor)
    if contender.startswith("harness"):
        times = _harness(runs, folder, "hitl" in contender, db_url, count)
        db = ("bench.db", "bench.db-wal")
    elif contender.startswith("langgraph"):
        times = _langgraph(runs, folder, contender.endswith("hitl"), synchronous,
                           "sync" if contender.endswith("sync") else "async", db_url, count)
        db = ("langgraph.db", "langgraph.db-wal")
    elif contender == "plain":
        times, db = _plain(runs, folder), ("ledger.jsonl",)
    elif db_url is not None:
        times, db = _floor_pg(runs, db_url, shape["records"], shape["transitions"]), ()
    else:
        times = _floor(runs, folder, shape["records"], shape["transitions"], synchronous)
        db = ("floor.db", "floor.db-wal")
    for name in db:
        if name.endswith(".db") and (folder / name).exists():
            with sqlite3.connect(folder / name) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if db_url is not None and "size_after" in EFFECTIVE:
        before = int(EFFECTIVE.pop("size_before"))
        grown = int(EFFECTIVE.pop("size_after")) - before
        # what the Runs keep once their dead row versions are gone (autovacuum, in a steady state): the
        # size after VACUUM FULL, which rewrites every table without them
        EFFECTIVE["live_bytes"] = _pg_live_size(db_url) - int(EFFECTIVE.pop("live_before"))
    else:
        grown = _folder_bytes(folder, db)
        if "live_before" in EFFECTIVE:
            EFFECTIVE["live_bytes"] = _sqlite_live_size(folder / db[0]) - int(EFFECTIVE.pop("live_before"))
    return {"times": times[warmup:], "runs_made": runs + count, "bytes": grown, "peak_rss_kb": _peak_rss_kb(),
            **EFFECTIVE}


def _peak_rss_kb() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that across exec, so a
    child would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---------------------------------------------------------------------------- parent side

def harness_shape() -> dict[str, int]:
    """Trace records and transitions of one example-shaped harness Run (the floor does as many)."""
    with tempfile.TemporaryDirectory() as tmp:
        from harness.config import build_runtime
        from harness.settings import Settings

        os.environ["HARNESS_EXAMPLE_LEDGER"] = str(Path(tmp) / "ledger.jsonl")
        rt = build_runtime(Settings(db=str(Path(tmp) / "s.db"), llm_rules=HERE / "fixtures" / "bench_rules.yaml",
                                    data_dir=Path(tmp) / "data"))
        result = rt.runs.create_run({"task": "bench A-1001", "user_id": "alice"})
        rt.store.drain_all()
        shape = {"records": len(rt.store.trace_of(result.run_id)),
                 "transitions": len(rt.store.transitions_of(result.run_id))}
        rt.close()
    return shape


def summarise(times: list[float]) -> dict[str, float]:
    """Median and p99 in ms, and Runs per second."""
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000,
            "runs_per_s": len(ordered) / sum(ordered)}


_METRICS = ("median_ms", "p99_ms", "runs_per_s", "bytes_per_run", "peak_rss_mb")
_PAIRS = (("harness", "langgraph"), ("harness", "langgraph-sync"), ("harness-hitl", "langgraph-hitl"),
          ("harness", "floor"), ("harness", "harness-base"), ("harness-hitl", "harness-hitl-base"),
          ("harness-base", "langgraph"), ("harness-base", "langgraph-sync"), ("harness-hitl-base", "langgraph-hitl"))


_COUNTS = ("commits", "write_commits", "rollbacks", "statements", "round_trips", "wire_bytes")


@contextlib.contextmanager
def _fresh_database(backend: str, pg_server: str) -> Iterator[str | None]:
    """A PostgreSQL database of its own for one contender's process (dropped after); None on SQLite."""
    if backend == "sqlite":
        yield None
        return
    import psycopg

    name = f"hk_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(pg_server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = pg_server.replace("postgresql://", "postgresql+psycopg://", 1) if "+psycopg" not in pg_server \
            else pg_server
        yield base.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(_libpq(pg_server), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _one_round(runs: int, contenders: Sequence[str], synchronous: str, warmup: int,
               shape: dict[str, int], backend: str = "sqlite", count: int = 0,
               pg_server: str = "", baseline_src: str | None = None) -> dict[str, dict[str, Any]]:
    """Every contender once, each in its own fresh process (and, on PostgreSQL, its own fresh database),
    in the order given."""
    results: dict[str, dict[str, Any]] = {}
    for contender in contenders:
        with tempfile.TemporaryDirectory() as tmp, _fresh_database(backend, pg_server) as db_url:
            extra = ["--db-url", db_url] if db_url else []
            env = dict(os.environ)
            if contender in BASELINES and baseline_src:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (baseline_src, env.get("PYTHONPATH")) if p)
            proc = subprocess.run(
                [sys.executable, __file__, "--child", contender, "--runs", str(runs), "--dir", tmp,
                 "--shape", json.dumps(shape), "--synchronous", synchronous, "--warmup", str(warmup),
                 "--count", str(count), *extra],
                capture_output=True, text=True, check=False, env=env)
            if proc.returncode != 0:
                results[contender] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            raw = json.loads(proc.stdout.strip().splitlines()[-1])
            results[contender] = {**summarise(raw["times"]), "bytes_per_run": raw["bytes"] / raw["runs_made"],
                                  "peak_rss_mb": raw["peak_rss_kb"] / 1024}
            if "live_bytes" in raw:
                results[contender]["live_bytes_per_run"] = raw["live_bytes"] / raw["runs_made"]
            for key in ("synchronous", "counts", "profile", "source"):
                if key in raw:
                    results[contender][key] = raw[key]
    return results


def measure(runs: int, contenders: tuple[str, ...], synchronous: str = "NORMAL", warmup: int = 20,
            repeats: int = 1, *, backend: str = "sqlite", count: int = 0,
            pg_server: str = PG_SERVER, baseline_src: str | None = None) -> dict[str, Any]:
    """Every contender in its own process, the same number of Runs each, `repeats` rounds (the order
    rotated each round, so no contender always runs first or last). A contender's numbers are the
    median over the rounds; a ratio is the median of the ratios taken within each round (the same
    machine conditions on both sides), with its range across rounds. `count` > 0: each contender then
    makes that many more Runs, untimed, with its commits, statements and round trips counted."""
    shape = harness_shape()
    rounds = []
    for i in range(repeats):
        order = list(contenders[i % len(contenders):]) + list(contenders[:i % len(contenders)])
        rounds.append(_one_round(runs, order, synchronous, warmup, shape, backend, count, pg_server, baseline_src))
    out: dict[str, Any] = {"backend": backend, "runs": runs, "warmup": warmup, "repeats": repeats,
                           "synchronous": synchronous if backend == "sqlite" else "server", "count": count,
                           "shape": shape, "results": {}}
    for contender in contenders:
        done = [r[contender] for r in rounds if "error" not in r[contender]]
        if not done:
            out["results"][contender] = rounds[-1][contender]
            continue
        merged: dict[str, Any] = {k: statistics.median(d[k] for d in done) for k in _METRICS}
        merged["median_ms_range"] = [min(d["median_ms"] for d in done), max(d["median_ms"] for d in done)]
        if "synchronous" in done[0]:
            merged["synchronous"] = done[0]["synchronous"]
        if all("live_bytes_per_run" in d for d in done):
            merged["live_bytes_per_run"] = statistics.median(d["live_bytes_per_run"] for d in done)
        counted = [d["counts"] for d in done if "counts" in d]
        if counted:
            merged["counts"] = {k: statistics.median(c[k] for c in counted) for k in _COUNTS if k in counted[0]}
        if "profile" in done[-1]:
            merged["profile"] = done[-1]["profile"]
        if "source" in done[-1]:
            merged["source"] = done[-1]["source"]
        out["results"][contender] = merged
    res = out["results"]
    if "median_ms" in res.get("harness", {}) and "median_ms" in res.get("plain", {}):
        out["harness_overhead_ms_per_run"] = res["harness"]["median_ms"] - res["plain"]["median_ms"]
    for ours, theirs in _PAIRS:
        within = [{k: r[ours][k] / r[theirs][k] for k in _METRICS if r[theirs][k]} for r in rounds
                  if "median_ms" in r.get(ours, {}) and "median_ms" in r.get(theirs, {})]
        if within:
            ratio: dict[str, Any] = {k: statistics.median(w[k] for w in within) for k in within[0]}
            ratio["median_ms_range"] = [min(w["median_ms"] for w in within), max(w["median_ms"] for w in within)]
            out.setdefault("ratios", {})[f"{ours}/{theirs}"] = ratio
    return out


def table(report: dict[str, Any]) -> str:
    """The results as Markdown tables."""
    where = (f"SQLite durability: synchronous={report['synchronous']}" if report["backend"] == "sqlite"
             else "PostgreSQL (loopback server; each contender its own fresh database)")
    lines = [f"{where}; {report['runs']} timed Runs per contender "
             f"after {report['warmup']} untimed; {report['repeats']} round(s), medians over the rounds "
             f"(ranges in brackets)", "",
             "| contender | median ms | p99 ms | Runs/s | bytes/Run | peak RSS MB | durability |",
             "|---|---|---|---|---|---|---|"]
    for name, r in report["results"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} | | | | | |")
            continue
        lines.append(f"| {name} | {r['median_ms']:.2f}{_span(r)} | {r['p99_ms']:.2f} | {r['runs_per_s']:.1f} | "
                     f"{r['bytes_per_run']:.0f} | {r['peak_rss_mb']:.1f} | {r.get('synchronous', '—')} |")
    if "harness_overhead_ms_per_run" in report:
        lines += ["", f"harness overhead per Run (harness - plain, medians): "
                      f"{report['harness_overhead_ms_per_run']:.2f} ms"]
    live = {n: r["live_bytes_per_run"] for n, r in report["results"].items() if "live_bytes_per_run" in r}
    if live:
        lines += ["", "Live bytes per Run: what the Runs' rows and indexes take, less the empty schema (PostgreSQL: "
                      "the database's size after VACUUM FULL, which drops dead row versions; SQLite: the pages in "
                      "use, free pages left out); bytes/Run above is the files' or database's growth:", ""]
        lines += [f"- {name}: {value:.0f}" for name, value in live.items()]
    lines += ["", "| ratio | median | p99 | Runs/s | bytes/Run | peak RSS |", "|---|---|---|---|---|---|"]
    for name, r in report.get("ratios", {}).items():
        cells = [f"{r.get(k, float('nan')):.2f}" for k in _METRICS]
        cells[0] += _span(r)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    counted = {n: r["counts"] for n, r in report["results"].items() if "counts" in r}
    if counted:
        keys = [k for k in _COUNTS if any(k in c for c in counted.values())]
        lines += ["", f"Per Run, counted over {report['count']} more Runs (untimed):", "",
                  "| contender | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for name, c in counted.items():
            lines.append(f"| {name} | " + " | ".join(f"{c[k]:.1f}" if k in c else "—" for k in keys) + " |")
    for name, r in report["results"].items():
        if r.get("profile"):
            lines += ["", f"The transactions of one {name} Run, in order:", "",
                      "| # | issued by | statements | round trips | end | what |", "|---|---|---|---|---|---|"]
            for i, t in enumerate(r["profile"], 1):
                lines.append(f"| {i} | {t['caller']} | {t['statements']} | {t['round_trips']} | {t['end']} | "
                             f"{t['what']} |")
    return "\n".join(lines)


def _span(r: dict[str, Any]) -> str:
    low, high = r.get("median_ms_range", (None, None))
    return f" [{low:.2f}-{high:.2f}]" if low is not None and low != high else ""


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="untimed Runs each contender makes first")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every contender (medians over rounds)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", choices=CONTENDERS + BASELINES, default=list(CONTENDERS))
    parser.add_argument("--child", choices=CONTENDERS + BASELINES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                        help="where every contender persists (default sqlite); postgresql: the loopback server")
    parser.add_argument("--pg-server", default=PG_SERVER,
                        help="the PostgreSQL server's URL (a fresh database is created there per contender)")
    parser.add_argument("--count", type=int, default=10,
                        help="Runs per contender made after the timed ones with every statement counted (0: none)")
    parser.add_argument("--baseline-src", help="a source tree of harness (its src/ folder) to run as harness-base "
                        "and harness-hitl-base beside the installed one: before and after a change, in one run")
    parser.add_argument("--db-url", help=argparse.SUPPRESS)
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL", "defaults"), default="NORMAL",
                        help="SQLite durability for every contender (default NORMAL); 'defaults': each its own")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.runs, Path(args.dir), json.loads(args.shape), args.synchronous,
                               args.warmup, args.db_url, args.count)))
        return
    only = tuple(args.only)
    if args.baseline_src:
        only += tuple(f"{c}-base" for c in only if c in ("harness", "harness-hitl") and f"{c}-base" not in only)
        args.baseline_src = str(Path(args.baseline_src).resolve())
    report = measure(args.runs, only, args.synchronous, args.warmup, max(1, args.repeats), backend=args.backend,
                     count=max(0, args.count), pg_server=args.pg_server, baseline_src=args.baseline_src)
    print(json.dumps(report, indent=2) if args.json else table(report))


if __name__ == "__main__":
    main()
