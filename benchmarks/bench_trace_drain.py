"""Trace drain rate (SPEC A4, D2): records per second from the outbox into the hash chain, drained
directly (SqlStore.drain_all) against through Redis Streams (RedisTraceBuffer), on each database.

For each backend that can be reached (SQLite file; PostgreSQL and MariaDB on loopback, in a database
created for the run and dropped after), the outbox is filled with N trace records of about 400 bytes
(in transactions of 100, as writers would), then drained in batches of B:
  * direct        SqlStore.drain_all(B): outbox → chain, one transaction per batch;
  * redis         the same records through the stream: relay (XADD via Lua, in-flight set) and chainer
                  (XREADGROUP, chain by record id, delete the outbox rows, XACK/XDEL) alternating;
  * relay only    outbox → stream for all N records at once (the Redis side alone);
  * chain only    stream → chain, batch after batch (the database side of the redis mode).

Run:  python benchmarks/bench_trace_drain.py [--records N] [--batch B] [--backends sqlite,postgresql,mariadb]
                                             [--redis redis://127.0.0.1:6379/0] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from harness.adapters.redis_stream import RedisTraceBuffer
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.domain.records import TraceRecordIn

#: backend -> (admin URL, URL of a named database, CREATE, DROP)
ADMIN = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                   "postgresql+psycopg://postgres@127.0.0.1:5432/{}",
                   'CREATE DATABASE "{}"', 'DROP DATABASE IF EXISTS "{}" WITH (FORCE)'),
    "mariadb": ("mysql+pymysql://root@127.0.0.1:3306/test", "mysql+pymysql://root@127.0.0.1:3306/{}",
                "CREATE DATABASE `{}`", "DROP DATABASE IF EXISTS `{}`"),
}


@contextmanager
def database(backend: str, tmp: Path) -> Iterator[str]:
    """A fresh database URL (or SQLite path) for one measurement, removed afterwards."""
    if backend == "sqlite":
        yield str(tmp / f"{uuid.uuid4().hex}.db")
        return
    admin_url, url, create, drop = ADMIN[backend]
    name = f"harness_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(create.format(name))
    try:
        yield url.format(name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(drop.format(name))
        admin.dispose()


def fill(store: SqlStore, records: int) -> None:
    """N records in the outbox, written 100 per transaction like a busy pipeline would."""
    body = "x" * 300
    for start in range(0, records, 100):
        store.record([TraceRecordIn("step", {"n": n, "run": "bench", "detail": body}, f"run-{n // 50}")
                      for n in range(start, min(start + 100, records))])


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(backend: str, records: int, batch: int, redis_url: str, tmp: Path) -> dict[str, Any]:
    """records/s of each mode on one backend; every chain is verified afterwards."""
    result: dict[str, Any] = {"backend": backend, "records": records, "batch": batch}
    with database(backend, tmp) as url:
        store = SqlStore.open(url)
        fill(store, records)
        seconds = timed(lambda: store.drain_all(batch))
        result["direct"] = records / seconds
        assert verify_chain(SqlAuditReads(store)).ok
        store.close()
    with database(backend, tmp) as url:
        store = SqlStore.open(url)
        buf = RedisTraceBuffer.from_url(redis_url, prefix=f"bench-{uuid.uuid4().hex}")
        store.trace_buffer = buf
        fill(store, records)
        seconds = timed(lambda: store.drain_all(batch))
        result["redis"] = records / seconds
        fill(store, records)
        result["relay_only"] = records / timed(lambda: buf.relay(store, records))

        def chain_all() -> None:
            while buf.chain(store, batch)[1]:
                pass

        result["chain_only"] = records / timed(chain_all)
        assert store.outbox_backlog() == 0 and verify_chain(SqlAuditReads(store)).ok
        buf.redis.delete(buf.stream, buf.inflight)
        store.close()
    return result


def reachable(backend: str) -> str | None:
    """None when the backend can be used, else why not."""
    if backend == "sqlite":
        return None
    try:
        engine = sa.create_engine(ADMIN[backend][0], poolclass=sa.pool.NullPool)
        with engine.connect():
            pass
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--backends", default="sqlite,postgresql,mariadb")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results, skipped = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            problem = reachable(backend)
            if problem:
                skipped[backend] = problem
                continue
            results.append(measure(backend, args.records, args.batch, args.redis, Path(tmp)))
    if args.json:
        print(json.dumps({"results": results, "skipped": skipped}, indent=2))
        return
    print(f"{'backend':<11} {'direct':>10} {'redis':>10} {'relay only':>11} {'chain only':>11}   records/s")
    for r in results:
        print(f"{r['backend']:<11} {r['direct']:>10,.0f} {r['redis']:>10,.0f} {r['relay_only']:>11,.0f} "
              f"{r['chain_only']:>11,.0f}")
    for backend, problem in skipped.items():
        print(f"{backend:<11} skipped: {problem}")


if __name__ == "__main__":
    main()
