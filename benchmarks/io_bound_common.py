"""What every contender of bench_io_bound.py shares (issue 37): the load (the tasks, the model), the fake model
server's counters, subprocesses that are always ended, and what is sampled while the Runs go: memory and CPU of a
contender's processes from /proc, and from its database the Runs by state and the connections to it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_vs_langgraph import _libpq
from cpu_share import TICK

#: the loopback PostgreSQL server: fresh databases are created (and dropped) there; BENCH_PG_SERVER names
#: another (for example a second cluster started with pg_stat_statements, leaving the main one alone)
PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
MODEL = "gpt-4o-mini"  # a model with a price in the bundled table (the example's policy denies unpriced ones)
ORDERS = ("A-1001", "A-1002", "A-1003", "A-1004")
FINAL = ("SUCCEEDED", "CLOSED_REJECTED", "CLOSED_FAILED", "CLOSED_CANCELLED")


def task(i: int) -> str:
    """The task of the i-th Run: where one of the example's orders is."""
    return f"Where is order {ORDERS[i % len(ORDERS)]}? (request {i})"


def reason(text: str) -> str:
    """A failure reason with its numbers written N, so that like failures group together."""
    return re.sub(r"\d+(\.\d+)?", "N", " ".join(text.split()))[:160]


def server_stats(origin: str, reset: bool = False) -> dict[str, Any]:
    """The fake server's counters (and a new count when `reset`)."""
    import httpx

    with httpx.Client(base_url=origin, timeout=10, trust_env=False) as client:
        answer = client.post("/stats/reset") if reset else client.get("/stats")
        answer.raise_for_status()
        doc: dict[str, Any] = answer.json()
        return doc


# ---------------------------------------------------------------------------- processes, from /proc

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                kids[int(stat[stat.rindex(")") + 2:].split()[1])].append(int(entry))
    return kids


def tree(roots: list[int]) -> list[int]:
    """The processes under these roots, the roots included."""
    kids, found, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, ()))
    return found


def cpu_s(pid: int) -> float | None:
    """A process's CPU seconds so far (user + system), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_cpu_s(postmaster: int) -> float | None:
    """CPU seconds (user + system) of a PostgreSQL server so far: its main process, the children it has
    reaped (every backend that ended) and the children alive now (backends, the WAL writer, the
    checkpointer). Between two readings, the server's work in that interval, whoever asked for it."""
    try:
        stat = Path(f"/proc/{postmaster}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    own = sum(int(f) for f in fields[11:15]) / TICK
    return own + sum(cpu_s(pid) or 0.0 for pid in tree([postmaster]) if pid != postmaster)


def memory_kb(pid: int) -> tuple[int, int]:
    """A process's resident and proportional set sizes (Rss, Pss) in KB; 0, 0 once it is gone."""
    rss = pss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


@contextlib.contextmanager
def process(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            log: Path | None = None, stdin: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """A subprocess in a session of its own, always ended on the way out: SIGTERM to its group, then SIGKILL."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE if stdin else out,
                            stderr=out, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait_s)
                break
        if log is not None:
            out.close()  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- what is sampled while Runs go

#: the loopback MariaDB server (root, no password): its database `test` is only used to create and drop the
#: contenders' own
MARIADB_SERVER = "mysql+pymysql://root@127.0.0.1:3306/test"


@contextlib.contextmanager
def fresh_mariadb(server: str = MARIADB_SERVER) -> Iterator[str]:
    """A MariaDB database of its own for one contender (dropped after): its URL."""
    import uuid

    name = f"hk_bench_{uuid.uuid4().hex[:10]}"
    _on_mariadb(f"CREATE DATABASE `{name}`")
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        _on_mariadb(f"DROP DATABASE IF EXISTS `{name}`")


def _on_mariadb(statement: str) -> None:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


class Database:
    """A contender's database as the sampler reads it: harness's Runs by state, and connections to it."""

    def __init__(self, url: str) -> None:
        self.postgres = url.startswith("postgresql")
        self.mariadb = url.startswith("mysql")
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(_libpq(url), autocommit=True)
        elif self.mariadb:
            import pymysql

            self.conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", database=url.rsplit("/", 1)[1],
                                        autocommit=True)
        else:
            self.conn = sqlite3.connect(f"file:{url}?mode=ro", uri=True, check_same_thread=False)
            self.conn.isolation_level = None

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """The rows of a query written with ? placeholders."""
        if self.postgres:
            return list(self.conn.execute(sql.replace("?", "%s"), params).fetchall())
        if self.mariadb:
            with self.conn.cursor() as cur:
                cur.execute(sql.replace("?", "%s"), params)
                return list(cur.fetchall())
        return list(self.conn.execute(sql, params).fetchall())

    def states(self, since: float) -> dict[str, int]:
        """Runs created since `since` (epoch seconds), by state; {} before harness made its tables."""
        try:
            return {s: int(n) for s, n in self.rows("SELECT state, count(*) FROM runs WHERE created_at >= ? "
                                                    "GROUP BY state", since)}
        except Exception:  # the schema is not there yet (LangGraph's database, or a service starting)
            if self.postgres:
                self.conn.rollback()
            return {}

    def server_pid(self) -> int | None:
        """The PostgreSQL server's main process (postmaster), when it runs on this machine and this user may
        read its data directory's setting; None on SQLite or otherwise."""
        if not self.postgres:
            return None
        try:
            folder = self.rows("SELECT setting FROM pg_settings WHERE name = 'data_directory'")[0][0]
            return int((Path(folder) / "postmaster.pid").read_text().split()[0])
        except Exception:  # not a superuser, or another host's server
            return None

    def connections(self) -> int:
        """Connections to this database other than this one (PostgreSQL, MariaDB; 0 on SQLite)."""
        if self.mariadb:
            return int(self.rows("SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
                                 "AND id <> CONNECTION_ID()")[0][0])
        if not self.postgres:
            return 0
        return int(self.rows("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND pid <> pg_backend_pid()")[0][0])

    def close(self) -> None:
        """Let the connection go."""
        self.conn.close()


class Sampler:
    """Every `interval` s, in a thread: memory (sum over the contender's processes; the peak kept), CPU per
    process, PostgreSQL connections and, for harness, Runs by state (peak of those driven at once)."""

    def __init__(self, roots: list[int], database: Database | None, since: float, interval: float = 0.25) -> None:
        self.roots, self.db, self.since, self.interval = roots, database, since, interval
        self.peak_rss_kb = self.peak_pss_kb = self.peak_pg = self.peak_driven = self.samples = 0
        self.states: dict[str, int] = {}
        self.cpu: dict[int, float] = {}
        self.base = {pid: cpu_s(pid) or 0.0 for pid in tree(roots)}
        #: the database server's CPU when it is PostgreSQL on this machine (its work for every client:
        #: run one contender at a time to read it as that contender's)
        self.server = database.server_pid() if database is not None else None
        self.server_base = server_cpu_s(self.server) if self.server is not None else None
        self.server_used: float | None = None
        self.errors: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()  # the last word: the CPU of processes still there
        if self.server is not None and self.server_base is not None:
            now = server_cpu_s(self.server)
            self.server_used = None if now is None else now - self.server_base

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as exc:  # a sample lost is counted and reported, not fatal
                self.errors[f"{type(exc).__name__}: {exc}"[:120]] += 1

    def sample(self) -> None:
        """One sample."""
        rss = pss = 0
        for pid in tree(self.roots):
            used = cpu_s(pid)
            if used is not None:
                self.cpu[pid] = used
            r, p = memory_kb(pid)
            rss, pss = rss + r, pss + p
        self.peak_rss_kb, self.peak_pss_kb = max(self.peak_rss_kb, rss), max(self.peak_pss_kb, pss)
        if self.db is not None:
            self.peak_pg = max(self.peak_pg, self.db.connections())
            states = self.db.states(self.since)
            if states:
                self.states = states
                driven = sum(n for s, n in states.items() if s != "CREATED" and s not in FINAL)
                self.peak_driven = max(self.peak_driven, driven)
        self.samples += 1

    @property
    def final(self) -> int:
        """Runs in a final state at the last sample."""
        return sum(self.states.get(s, 0) for s in FINAL)

    def cpu_used(self) -> float:
        """CPU seconds the contender's processes used since the sampler was made."""
        return sum(used - self.base.get(pid, 0.0) for pid, used in self.cpu.items())

    def report(self) -> dict[str, Any]:
        """Peaks and CPU, in MB and seconds."""
        return {"peak_rss_mb": self.peak_rss_kb / 1024, "peak_pss_mb": self.peak_pss_kb / 1024,
                "peak_pg_connections": self.peak_pg, "cpu_s": self.cpu_used(), "samples": self.samples,
                "db_cpu_s": self.server_used,
                **({"sample_errors": dict(self.errors)} if self.errors else {})}
