"""Accepted means executed (SPEC S1 / K5, queued is not stuck): a Run that has not started waits in the queue
whatever its age; only a start deadline closes it, with its own reason; a full queue refuses new Runs before
anything is written; the queue is taken oldest first. On SQLite, PostgreSQL and MariaDB, on the fake clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.audit.reconcile import reconcile
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.errors import BacklogFullError, InvalidRequestError
from harness.domain.ids import ordered_id
from harness.drive.sweeper import ZombieSweeper
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.settings import Settings

from ..conftest import FIXTURES

S = RunState
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
NOT_STARTED_PATH = ["CREATED", "FAILED", "TRACING", "CLOSED_FAILED"]


def runtime_on(url: str, tmp_path: Path, clock: FakeClock, **settings: Any) -> Runtime:
    """The test skills, rules and policy on the database at `url`, on the fake clock."""
    return build_runtime(Settings(db=url, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                                  llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                                  data_dir=tmp_path / "data", memory="off", **settings), clock=clock)


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, clock: FakeClock, call_log: Path) -> Iterator[Runtime]:
    """A runtime on the backend under test, with no default start deadline and the default backlog bound."""
    runtime = runtime_on(backend_url, tmp_path, clock)
    yield runtime
    runtime.close()


def at(clock: FakeClock, seconds: float) -> str:
    """The fake clock's now plus `seconds`, as ISO 8601 (what a caller sends as start_by)."""
    return dt.datetime.fromtimestamp(clock.now() + seconds, dt.UTC).isoformat()


def path(rt: Runtime, run_id: str) -> list[str]:
    return [x.to_state.value for x in rt.store.transitions_of(run_id)]


def assert_audit_clean(rt: Runtime) -> None:
    """What `harness audit verify` and `harness audit reconcile` check: both clean."""
    rt.store.drain_all()
    chain = verify_chain(SqlAuditReads(rt.store))
    assert chain.ok, chain
    assert reconcile(SqlReconcileReads(rt.store)).ok


def run_count(rt: Runtime) -> int:
    with rt.store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one())


def test_a_queued_run_far_past_every_threshold_is_requeued_not_failed(rt: Runtime, clock: FakeClock) -> None:
    """A Run accepted and never started, ten hours later (past every threshold and heartbeat ceiling), is
    handed back to a driver at every sweep (audited once as re-queued, never as a zombie), or left queued
    when the sweep has no driver; driven at last, it succeeds."""
    run = rt.runs.submit({"task": "echo hi", **TESS})[0]
    clock.advance(10 * 3600)
    handed: list[str] = []
    sweeper = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds(), resume=handed.append)
    for _ in range(3):
        report = sweeper.sweep_once()
        assert report.requeued == [run.run_id] and not report.detected and not report.recovered
        clock.advance(3600)
    assert handed == [run.run_id] * 3
    alone = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds()).sweep_once()  # `harness sweep`
    assert alone.queued == [run.run_id] and not alone.detected
    assert rt.store.get_run(run.run_id).state == S.CREATED
    events = [e.event for e in rt.store.audit_events(run_id=run.run_id)]
    assert events.count("run_requeued") == 1 and not {"zombie_detected", "zombie_recovered"} & set(events)
    assert rt.runs.drive(run.run_id).state == "SUCCEEDED"
    assert_audit_clean(rt)


def test_a_start_deadline_closes_a_queued_run_with_its_own_reason(backend_url: str, tmp_path: Path,
                                                                   clock: FakeClock, call_log: Path) -> None:
    """The request's start_by, or the deployment's queue_max_wait_s, closes a Run still queued then:
    CLOSED_FAILED with a `not_started` error and audit event, never run, nothing called a zombie; a Run with
    no deadline keeps waiting; the chain verifies and reconcile agrees."""
    rt = runtime_on(backend_url, tmp_path, clock, queue_max_wait_s=120)
    try:
        own = rt.runs.submit({"task": "echo own", "start_by": at(clock, 60), **TESS})[0]
        default = rt.runs.submit({"task": "echo default", **TESS})[0]
        later = rt.runs.submit({"task": "echo later", "start_by": at(clock, 86_400), **TESS})[0]
        sweeper = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds())
        clock.advance(59)
        assert sweeper.sweep_once().not_started == []
        clock.advance(2)
        assert sweeper.sweep_once().not_started == [own.run_id]
        clock.advance(60)
        report = sweeper.sweep_once()
        assert report.not_started == [default.run_id] and report.queued == [later.run_id]
        for run_id in (own.run_id, default.run_id):
            assert path(rt, run_id) == NOT_STARTED_PATH
            result = rt.runs.result(run_id)
            assert result.state == "CLOSED_FAILED" and (result.error or "").startswith("not_started: waited in the")
            events = [e.event for e in rt.store.audit_events(run_id=run_id)]
            assert "run_not_started" in events and not any(e.startswith("zombie") for e in events)
        assert call_log.read_text() == ""  # nothing of theirs ran
        assert rt.store.get_run(later.run_id).state == S.CREATED
        assert_audit_clean(rt)
    finally:
        rt.close()


@pytest.mark.parametrize("fresh", [False, True])
def test_the_driver_refuses_a_late_start(rt: Runtime, clock: FakeClock, call_log: Path, fresh: bool) -> None:
    """A driver that reaches a queued Run after its start deadline closes it not_started instead of running
    it late: whether it drives it as found (a re-drive) or as handed a new Run (a worker's fresh path)."""
    run = rt.runs.submit({"task": "echo late", "start_by": at(clock, 30), **TESS})[0]
    clock.advance(31)
    result = RunWorker(rt).execute(run.run_id, fresh=fresh) if fresh else rt.runs.drive(run.run_id)
    assert result is not None and result.state == "CLOSED_FAILED"
    assert (result.error or "").startswith("not_started:") and path(rt, run.run_id) == NOT_STARTED_PATH
    noticed = rt.store.audit_events(run_id=run.run_id, event="run_not_started")
    assert [e.detail["noticed_by"] for e in noticed] == ["driver"]
    assert call_log.read_text() == ""
    assert_audit_clean(rt)


def test_a_run_started_in_time_is_not_closed(rt: Runtime, clock: FakeClock) -> None:
    """The deadline is for starting: a Run driven before it runs to its end, and the sweeper leaves it be."""
    run = rt.runs.submit({"task": "echo hi", "start_by": at(clock, 30), **TESS})[0]
    assert rt.runs.drive(run.run_id).state == "SUCCEEDED"
    clock.advance(3600)
    assert ZombieSweeper(rt.store, rt.machine).sweep_once().not_started == []


def test_a_start_by_already_past_or_without_a_timezone_is_bad_input(rt: Runtime, clock: FakeClock) -> None:
    """A start_by that has passed, or that names no offset, is refused naming the field; nothing written."""
    with pytest.raises(InvalidRequestError, match=r"start_by.*already passed"):
        rt.runs.submit({"task": "echo hi", "start_by": at(clock, -1), **TESS})
    with pytest.raises(InvalidRequestError, match="start_by"):
        rt.runs.submit({"task": "echo hi", "start_by": "2030-01-01T00:00:00", **TESS})
    assert run_count(rt) == 0


def test_a_full_backlog_refuses_new_runs_before_anything_is_written(backend_url: str, tmp_path: Path,
                                                                     clock: FakeClock, call_log: Path) -> None:
    """At max_backlog Runs waiting to start, counted in the database, a new Run — submitted, or asked for and
    driven at once — is refused with the backlog, the bound and when to retry, and nothing is written; once
    one starts, a Run is accepted again."""
    rt = runtime_on(backend_url, tmp_path, clock, max_backlog=3, backlog_retry_after_s=7)
    try:
        queued = [rt.runs.submit({"task": f"echo {i}", **TESS})[0].run_id for i in range(3)]
        assert rt.store.backlog(3) == 3 and rt.store.backlog(2) == 2  # counted no further than the bound
        before = (run_count(rt), len(rt.store.audit_events()))
        for ask in (rt.runs.submit, rt.runs.create_run):
            with pytest.raises(BacklogFullError) as refused:
                ask({"task": "echo one more", **TESS})
            assert (refused.value.backlog, refused.value.bound, refused.value.retry_after_s) == (3, 3, 7)
            assert "retry after 7 s" in str(refused.value) and "HARNESS_MAX_BACKLOG" in str(refused.value)
        assert (run_count(rt), len(rt.store.audit_events())) == before
        assert rt.runs.drive(queued[0]).state == "SUCCEEDED"
        assert rt.runs.create_run({"task": "echo one more", **TESS}).state == "SUCCEEDED"
    finally:
        rt.close()


def test_the_redrive_takes_queued_runs_oldest_first(rt: Runtime, clock: FakeClock) -> None:
    """Runs nobody drives are handed out in the order they were accepted, ties on a still clock included."""
    ids = []
    same_instant = sorted(ordered_id() for _ in range(3))  # ids are time-ordered only to the millisecond
    for i in range(6):
        ids.append(rt.runs.submit({"task": f"echo {i}", **TESS}, run_id=same_instant[i - 3] if i >= 3 else None)[0]
                   .run_id)
        if i < 3:
            clock.advance(1)  # the last three accepted in the same instant
    clock.advance(rt.settings.redrive_grace_s + 1)
    assert rt.store.unowned_runs(rt.settings.redrive_grace_s) == ids
    assert rt.store.unowned_runs(rt.settings.redrive_grace_s, limit=2) == ids[:2]


def test_migration_0017_adds_the_start_deadline_and_reverts(empty_backend_url: str) -> None:
    """A Run queued before 0017 has no start deadline after it (it waits as it was promised); the column
    comes and goes with the migration."""
    from alembic import command

    from harness.adapters.sql.database import create_engine, resolve_url
    from harness.adapters.sql.store import SqlStore
    from harness.domain.records import NewRun

    from .test_migration_0006 import _to, _version

    engine = create_engine(resolve_url(empty_backend_url))
    try:
        _to(engine, command.upgrade, "0016_binary_hashes")
        store = SqlStore(engine, FakeClock())
        run, _ = store.create_run(NewRun("t1", "tess", "s", {"task": "queued before"}))
        _to(engine, command.upgrade, "0017_start_by")
        assert _version(engine) == "0017_start_by"
        with engine.connect() as conn:
            assert conn.execute(sa.select(t.runs.c.start_by)).scalars().all() == [None]
        assert store.overdue_unstarted(store.clock.now() + 10**9, 10) == [] and store.backlog(10) == 1
        _to(engine, command.downgrade, "0016_binary_hashes")
        assert "start_by" not in {c["name"] for c in sa.inspect(engine).get_columns("runs")}
        with engine.connect() as conn:  # the Run is still there, queued (read by column: a later one is gone)
            assert conn.execute(sa.select(t.runs.c.state).where(t.runs.c.run_id == run.run_id)).scalar_one() \
                == S.CREATED.value
    finally:
        engine.dispose()
