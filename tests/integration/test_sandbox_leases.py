"""The scarce units behind sandbox instances, on SQLite, PostgreSQL and MariaDB: racing callers never get
more instances or ports than there are; leases that nobody renews expire (on the injected clock); the
sweeper releases the instances of Runs closed elsewhere and stops their processes; held seconds are billed
once, in the Run's close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.sandbox.instance import alive
from harness.adapters.sandbox.rlimit import RlimitSandbox
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.sandbox import DEAD, LIVE, RELEASED, Holder, PoolSettings, SandboxJob
from harness.pipeline.sandbox_pool import SandboxUnavailableError
from harness.wiring.sandbox import sandbox_pool
from tests.acceptance.agent_skills import TESTER
from tests.acceptance.checks import assert_audit_clean
from tests.integration.instance_skills import instance_settings
from tests.integration.test_sandbox import need_bwrap

SANDBOX = RlimitSandbox(warn=False)


@pytest.fixture
def world(backend_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    rt = build_runtime(instance_settings(tmp_path, db=backend_url, sandbox="rlimit", sandbox_ports="46000-46004",
                                         sandbox_host_cap=3, sandbox_tenant_cap=10), clock=clock)
    yield rt
    rt.close()


def job(run_id: str, folder: Path, skill_id: str = "test.hold") -> SandboxJob:
    return SandboxJob(skill_id=skill_id, function="hold", arguments={}, context={"run_id": run_id},
                      workdir=folder, wall_s=5)


def runs(rt: Runtime, n: int) -> list[str]:
    return [rt.runs.submit({"task": f"say {i}", **TESTER})[0].run_id for i in range(n)]


def test_racing_callers_never_get_more_than_the_cap(world: Runtime, tmp_path: Path) -> None:
    """Eight callers released together for a host cap of three: exactly three get an instance, the others
    are told the cap is full; the ports they hold are distinct and from the pool."""
    pool = world.tools.sandbox_pool
    assert pool is not None
    ids, barrier = runs(world, 8), threading.Barrier(8)
    got, refused = [], []

    def take(run_id: str) -> None:
        barrier.wait()
        try:
            got.append(pool.lease(SANDBOX, job(run_id, tmp_path), tenant_id="t1", user_id="tess", persistent=False,
                                  ports=1, deadline=time.monotonic() + 0.3))
        except SandboxUnavailableError as exc:
            refused.append(exc.resource)

    threads = [threading.Thread(target=take, args=(r,)) for r in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 3 and refused == ["the host's instance cap (3)"] * 5
    ports = [p for lease in got for p in lease.row.ports]
    assert len(set(ports)) == 3 and all(46000 <= p <= 46004 for p in ports)
    assert pool.table.use().ports_by_host == {world.settings.sandbox_host: 3}


def test_a_lease_nobody_renews_expires(world: Runtime, tmp_path: Path, clock: FakeClock) -> None:
    """An instance of another host whose lease that host stopped renewing is reclaimed once the lease has
    passed, and only then: its units are free again and its Run's trail says why."""
    pool = world.tools.sandbox_pool
    assert pool is not None
    (run_id,) = runs(world, 1)
    elsewhere = sandbox_pool(world.store, PoolSettings(host="elsewhere", lease_s=60), owner="elsewhere:1")
    lease = elsewhere.lease(SANDBOX, job(run_id, tmp_path), tenant_id="t1", user_id="tess", persistent=False,
                            ports=1, deadline=time.monotonic() + 1)
    clock.advance(59)
    assert pool.reclaim_dead() == 0
    clock.advance(2)
    assert pool.reclaim_dead() == 1
    row = pool.table.get(run_id, "test.hold")
    assert row is not None and row.state == DEAD and row.end_reason == "its host elsewhere stopped renewing its lease"
    assert pool.table.use().live_by_host == {} and pool.table.use().ports_by_host == {}
    reclaimed = [e.detail for e in world.store.audit_events(run_id=run_id, event="sandbox_instance_reclaimed")]
    assert [d["ports"] for d in reclaimed] == [list(lease.row.ports)]


def test_the_sweeper_releases_instances_of_runs_closed_elsewhere(world: Runtime, tmp_path: Path) -> None:
    """An instance whose Run is already final (closed by a process that did not release it) is released
    by this host's sweep, with the reason in the Run's trail."""
    pool = world.tools.sandbox_pool
    assert pool is not None
    closed = world.runs.create_run({"task": "say done", **TESTER})
    assert closed.state == "SUCCEEDED"
    pool.lease(SANDBOX, job(closed.run_id, tmp_path), tenant_id="t1", user_id="tess", persistent=False, ports=0,
               deadline=time.monotonic() + 1)
    world.runs.prune_workdirs()
    row = pool.table.get(closed.run_id, "test.hold")
    assert row is not None and row.state == RELEASED and row.end_reason == "its Run closed elsewhere"
    assert pool.table.live() == []


def test_a_kept_instance_is_billed_once_in_the_close(world: Runtime, tmp_path: Path, clock: FakeClock) -> None:
    """The seconds a kept instance existed (on the injected clock) are one CostTrace of its Run, recorded
    in the transaction that enters TRACING, so the RunTrace's total includes them and reconcile agrees."""
    pool = world.tools.sandbox_pool
    assert pool is not None
    waiting = world.runs.submit({"task": "say later", **TESTER})[0].run_id
    for event in ("created", "reused"):  # a second call of the Run reuses its instance (rlimit: no process)
        lease = pool.lease(SANDBOX, job(waiting, tmp_path, "test.devserver"), tenant_id="t1", user_id="tess",
                           persistent=True, ports=1, deadline=time.monotonic() + 1)
        assert lease.event == event and lease.row.generation == 1
    clock.advance(42)
    done = world.runs.drive(waiting)
    assert done.state == "SUCCEEDED"
    total = world.runs.ledger.run_total(waiting)
    assert total.sandbox_s == pytest.approx(42.0)
    row = pool.table.get(waiting, "test.devserver")
    assert row is not None and row.state == RELEASED and row.billed and row.held_s == pytest.approx(42.0)
    assert_audit_clean(world)  # verify and reconcile: the RunTrace's total includes the instance's seconds


def test_a_run_closed_on_another_host_has_its_process_stopped_here(tmp_path: Path) -> None:
    """When another host closes the Run, it releases the instance in the database but cannot reach its
    process; this host's next sweep stops it."""
    need_bwrap()
    rt = build_runtime(instance_settings(tmp_path))
    pool = rt.tools.sandbox_pool
    assert pool is not None
    try:
        (run_id,) = runs(rt, 1)
        lease = pool.lease(rt.tools.sandbox(), job(run_id, rt.tools.workdirs.ensure(run_id), "test.devserver"),
                           tenant_id="t1", user_id="tess", persistent=True, ports=1, deadline=time.monotonic() + 10)
        assert alive(lease.holder)
        pool.table.end_now(lease.row, RELEASED, "its Run is closing", rt.store.clock.now())  # as host B would
        assert alive(lease.holder)
        rt.runs.prune_workdirs()
        assert not alive(Holder(lease.holder.pid, lease.holder.pid_start))
        row = pool.table.get(run_id, "test.devserver")
        assert row is not None and row.pid is None and row.state == RELEASED
        assert row.state != LIVE
    finally:
        pool.stop_ended()
        rt.close()
