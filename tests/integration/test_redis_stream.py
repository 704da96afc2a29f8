"""Redis Streams as the trace buffer (SPEC A4, D2): outbox → stream → chain in batches, idempotent by
record id; a Redis outage never blocks a Run and loses no record; a chainer that dies between its
commit and its ack is re-delivered without a duplicate."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.redis_stream import RECOVERED, UNAVAILABLE, RedisTraceBuffer
from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.errors import InvalidRequestError
from harness.domain.records import PendingRecord, TraceRecordIn
from harness.kernel.states import FINAL, RunState
from harness.settings import Settings

from ..conftest import FIXTURES
from .conftest import require_service, wait_for_port

TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def buffer(redis_url: str) -> Iterator[RedisTraceBuffer]:
    """A buffer on the shared Redis under a prefix of its own, whose keys are deleted afterwards."""
    buf = RedisTraceBuffer.from_url(redis_url, prefix=f"test-{uuid.uuid4().hex}", claim_idle_s=0.2)
    yield buf
    buf.redis.delete(buf.stream, buf.inflight)
    buf.close()


def _record_ids(store: SqlStore, table: sa.Table) -> list[str]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.select(table.c.record_id)).scalars())


def _assert_all_chained_once(store: SqlStore, buf: RedisTraceBuffer, expected: set[str]) -> None:
    """Every expected record is in the chain exactly once, nothing waits anywhere, the chain verifies."""
    chained = _record_ids(store, t.trace_records)
    assert len(chained) == len(set(chained)), "a record was chained twice"
    assert expected <= set(chained), f"{len(expected - set(chained))} records lost"
    assert store.outbox_backlog() == 0
    assert buf.redis.xlen(buf.stream) == 0 and buf.redis.scard(buf.inflight) == 0
    report = verify_chain(SqlAuditReads(store))
    assert report.ok, report.first_bad


def test_records_flow_outbox_to_stream_to_chain_in_batches(backend_url: str,
                                                           buffer: RedisTraceBuffer) -> None:
    """Records go outbox → stream → chain one batch per drain, each once, and the chain verifies."""
    store = SqlStore.open(backend_url, FakeClock())
    store.trace_buffer = buffer
    try:
        for i in range(12):
            store.record([TraceRecordIn("step", {"i": i, "j": j, "text": "é🚀"}) for j in range(100)])
        expected = set(_record_ids(store, t.outbox))
        assert store.drain(batch_size=250) == 250
        assert len(expected - set(_record_ids(store, t.outbox))) == 250
        assert store.drain_all(batch_size=250) == 950
        _assert_all_chained_once(store, buffer, expected)
    finally:
        store.close()


def test_a_redelivered_batch_is_dropped_by_record_id(tmp_path: Path, buffer: RedisTraceBuffer) -> None:
    """A stream entry whose record is already chained (a second relay, a lost ack) is acked, not
    chained again."""
    store = SqlStore.open(str(tmp_path / "h.db"), FakeClock())
    try:
        store.record([TraceRecordIn("step", {"n": n}) for n in range(5)])
        records = store.pending_records(10)
        buffer.relay(store, 10)
        assert buffer.chain(store, 10) == (5, 5)
        again = [(r.record_id, r.run_id or "", r.kind, r.payload) for r in records]
        buffer.redis.xadd(buffer.stream, dict(zip("rukp", again[2], strict=True)))
        head = store.chain_head()
        assert buffer.chain(store, 10) == (0, 1)
        assert store.chain_head() == head
        _assert_all_chained_once(store, buffer, {r.record_id for r in records})
    finally:
        store.close()


def test_concurrent_chainers_share_the_stream_without_a_fork(tmp_path: Path, redis_url: str) -> None:
    """Three buffers (three consumers of one group, one of them shared by two threads) draining at once
    chain every record once (A3)."""
    store = SqlStore.open(str(tmp_path / "h.db"), FakeClock())
    prefix = f"test-{uuid.uuid4().hex}"
    first = RedisTraceBuffer.from_url(redis_url, prefix=prefix)
    buffers = [first, first, *(RedisTraceBuffer.from_url(redis_url, prefix=prefix) for _ in range(2))]
    try:
        for i in range(20):
            store.record([TraceRecordIn("step", {"i": i, "j": j}) for j in range(50)])
        expected = set(_record_ids(store, t.outbox))
        totals: list[int] = []
        threads = [threading.Thread(target=lambda b=b: totals.append(b.drain_all(store, 40)))
                   for b in buffers]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        leftover = buffers[0].drain_all(store, 40)  # a thread may stop while another still relays
        assert sum(totals) + leftover == 1000
        _assert_all_chained_once(store, buffers[0], expected)
    finally:
        buffers[0].redis.delete(buffers[0].stream, buffers[0].inflight)
        for b in buffers[1:]:
            b.close()
        store.close()


# ------------------------------------------------------------------------------ a chainer killed


def _commit_then_die(db: str, url: str, prefix: str) -> None:
    """Child: relay and chain one batch, and die by SIGKILL right after the commit, before the ack."""
    store = SqlStore.open(db, migrate_schema=False)
    buf = RedisTraceBuffer.from_url(url, prefix=prefix)
    commit = store.chain_records

    def chain_then_die(records: Any) -> int:
        commit(records)
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    store.chain_records = chain_then_die  # type: ignore[method-assign]
    buf.drain(store, 50)


def test_a_chainer_killed_between_commit_and_ack_is_redelivered_without_a_duplicate(
    tmp_path: Path, buffer: RedisTraceBuffer, redis_url: str
) -> None:
    """A batch a dead chainer committed but never acked is claimed by another chainer and dropped by
    record id; the rest is chained, each record once (A4)."""
    db = str(tmp_path / "h.db")
    store = SqlStore.open(db, FakeClock())
    try:
        store.record([TraceRecordIn("step", {"n": n}) for n in range(120)])
        expected = set(_record_ids(store, t.outbox))
        prefix = buffer.stream.split("}")[0].lstrip("{")
        child = mp.get_context("spawn").Process(target=_commit_then_die, args=(db, redis_url, prefix))
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        assert len(_record_ids(store, t.trace_records)) == 50, "the dead chainer's commit is not there"
        pending = buffer.redis.xpending(buffer.stream, buffer.group)
        assert pending["pending"] == 50, "the dead chainer's batch should still await its ack"
        time.sleep(0.3)  # past the claim idle time: the batch is the dead consumer's no longer
        assert buffer.drain_all(store, 50) == 70
        _assert_all_chained_once(store, buffer, expected)
        assert buffer.redis.xpending(buffer.stream, buffer.group)["pending"] == 0
    finally:
        store.close()


# ------------------------------------------------------------------------------ Redis goes away


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own, without persistence: a restart comes back empty."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for_port(self.port, timeout_s=10), "private redis-server did not start"

    def kill(self) -> None:
        """Crash the server (SIGKILL): whatever it held is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None
        assert wait_for_port(self.port, up=False, timeout_s=10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A private redis-server on a free loopback port (the shared 6379 is never stopped)."""
    require_service("redis")
    if shutil.which("redis-server") is None:
        if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


def test_a_redis_outage_blocks_no_run_and_loses_no_record(
    tmp_path: Path, private_redis: PrivateRedis, call_log: Path
) -> None:
    """With Redis crashed, Runs still reach their final states and their records wait in the outbox;
    records Redis held but had not chained are relayed again; after Redis is back every record is
    chained exactly once, and the outage and recovery are audited (A4)."""
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                        identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data",
                        trace_buffer=f"redis://127.0.0.1:{private_redis.port}/0")
    rt = build_runtime(settings, clock=FakeClock())
    buf = rt.store.trace_buffer
    assert isinstance(buf, RedisTraceBuffer)
    buf.retry_s = 0.05
    try:
        assert rt.runs.create_run({"task": "echo before", **TESTER}).state == "SUCCEEDED"
        assert rt.store.outbox_backlog() == 0
        rt.store.record([TraceRecordIn("step", {"n": n}) for n in range(30)])
        in_flight = {r.record_id for r in rt.store.pending_records(100)}
        assert buf.relay(rt.store, 100) == 30  # in the stream, not yet chained, when Redis dies
        private_redis.kill()

        started = time.monotonic()
        tasks = ("echo during", "fail", "prose")
        states = [rt.runs.create_run({"task": task, **TESTER}).state for task in tasks]
        assert all(RunState(s) in FINAL for s in states)
        assert time.monotonic() - started < 20
        assert rt.store.outbox_backlog() > 30
        assert buf.last_error is not None
        waiting = set(_record_ids(rt.store, t.outbox))
        assert in_flight <= waiting

        private_redis.start()
        time.sleep(0.1)  # past retry_s
        rt.store.drain_all()
        _assert_all_chained_once(rt.store, buf, waiting)
        events = [e.event for e in rt.store.audit_events() if e.event in (UNAVAILABLE, RECOVERED)]
        rt.store.drain_all()
        assert events == [UNAVAILABLE, RECOVERED]
        assert verify_chain(SqlAuditReads(rt.store)).ok
    finally:
        rt.close()


def test_settings_select_the_trace_buffer(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """HARNESS_TRACE_BUFFER selects Redis Streams; unset, the outbox drains straight into the chain;
    a URL that is not Redis is refused."""
    assert Settings.from_env().trace_buffer is None
    monkeypatch.setenv("HARNESS_TRACE_BUFFER", redis_url)
    assert Settings.from_env().trace_buffer == redis_url
    buf = RedisTraceBuffer.from_url(f"{redis_url}?prefix=custom")
    assert buf.stream == "{custom}:trace:stream"
    assert buf.redis.ping()
    buf.close()
    with pytest.raises(InvalidRequestError):
        RedisTraceBuffer.from_url("postgresql://127.0.0.1/x")


def test_an_unreachable_redis_costs_a_closing_run_no_time(tmp_path: Path) -> None:
    """With nothing listening, a drain returns at once (no retry loop, then a pause of retry_s) and
    the records stay in the outbox."""
    store = SqlStore.open(str(tmp_path / "h.db"), FakeClock())
    store.trace_buffer = RedisTraceBuffer.from_url(f"redis://127.0.0.1:{_free_port()}/0", retry_s=60)
    try:
        store.record([TraceRecordIn("step", {"n": 1})])
        started = time.monotonic()
        assert store.drain_all() == 0
        assert store.drain_all() == 0  # within retry_s: Redis is not even tried
        assert time.monotonic() - started < 2
        assert store.outbox_backlog() == 2  # the record and the trace_buffer_unavailable audit event
        assert [e.event for e in store.audit_events()] == [UNAVAILABLE]
    finally:
        store.close()


def test_pending_record_round_trips_through_the_stream_fields(buffer: RedisTraceBuffer,
                                                              tmp_path: Path) -> None:
    """A record without a Run (run_id None) and with a large non-ASCII payload comes back identical."""
    store = SqlStore.open(str(tmp_path / "h.db"), FakeClock())
    try:
        store.record([TraceRecordIn("audit", {"big": "ß😀" * 100_000})])
        [before] = store.pending_records(1)
        buffer.drain_all(store, 10)
        [after] = list(store.iter_trace())
        assert PendingRecord(after.record_id, after.run_id, after.kind, after.payload) == before
        assert before.run_id is None
    finally:
        store.close()

