"""The sandbox pool's policy runs on its ports alone: an in-memory instance store and a fake view of the
host's processes stand in for the database and /proc, so no database, sandbox or process is needed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.clock import FakeClock
from harness.domain.sandbox import (
    DEAD,
    LIVE,
    RELEASED,
    Capacity,
    Claim,
    Holder,
    InstanceRow,
    PoolSettings,
    PoolUse,
    SandboxJob,
    SandboxOutcome,
    ShortageError,
)
from harness.domain.traces import CostTrace
from harness.kernel.states import RunState
from harness.pipeline.sandbox_pool import SandboxPool, SandboxUnavailableError
from harness.ports import Tx


class MemoryInstances:
    """SandboxInstances in a dict: units are counted per resource, audit events kept in a list."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.rows: dict[str, InstanceRow] = {}
        self.units: dict[str, set[tuple[str, int]]] = {}
        self.events: list[tuple[str | None, str, dict[str, Any]]] = []

    def get(self, run_id: str, skill_id: str) -> InstanceRow | None:
        return self.rows.get(f"{run_id}/{skill_id}")

    def acquire(self, claim: Claim, capacity: Capacity, now: float, lease_until: float) -> InstanceRow:
        key, taken = f"{claim.run_id}/{claim.skill_id}", set()
        ports: tuple[int, ...] = ()
        for resource, name, units, count in capacity.needs(claim):
            held = {u for k, held in self.units.items() for r, u in held if r == resource and k != key}
            free = [u for u in units if u not in held][:count]
            if len(free) < count:
                raise ShortageError(name)
            taken |= {(resource, u) for u in free}
            ports = tuple(free) if resource.startswith("port:") else ports
        self.units[key] = taken
        old = self.rows.get(key)
        self.rows[key] = InstanceRow(
            key, claim.run_id, claim.skill_id, claim.tenant_id, claim.user_id, claim.host, LIVE, claim.isolation,
            None, None, claim.owner, ports, old.generation + 1 if old else 1, old.calls if old else 0,
            claim.persistent, old.held_s if old else 0.0, False, now, now, now, lease_until, None, None,
            claim.provider)
        return self.rows[key]

    def started(self, instance_id: str, pid: int | None, pid_start: int | None, now: float, *,
                new_generation: bool = False) -> InstanceRow:
        row = self.rows[instance_id]
        if new_generation:
            row = replace(row, held_s=row.held_until(now), generation=row.generation + 1)
        self.rows[instance_id] = replace(row, pid=pid, pid_start=pid_start, started_at=now, used_at=now,
                                         calls=row.calls + 1)
        return self.rows[instance_id]

    def touch(self, instance_id: str, now: float, lease_until: float) -> None:
        row = self.rows[instance_id]
        self.rows[instance_id] = replace(row, calls=row.calls + 1, used_at=now, lease_expires_at=lease_until)

    def end(self, tx: Tx, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        return self.end_now(row, state, reason, now)

    def end_now(self, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        if self.rows[row.instance_id].state != LIVE:
            return False
        self.rows[row.instance_id] = replace(row, state=state, end_reason=reason, ended_at=now,
                                             held_s=row.held_until(now))
        self.units.pop(row.instance_id, None)
        return True

    def of_run(self, tx: Tx, run_id: str) -> list[InstanceRow]:
        return [r for r in self.rows.values() if r.run_id == run_id]

    def mark_billed(self, tx: Tx, instance_id: str) -> None:
        self.rows[instance_id] = replace(self.rows[instance_id], billed=True)

    def live(self, host: str | None = None, *, tenant_id: str | None = None) -> list[InstanceRow]:
        return [r for r in self.rows.values() if r.state == LIVE and host in (None, r.host)
                and tenant_id in (None, r.tenant_id)]

    def ended_with_process(self, host: str) -> list[InstanceRow]:
        return [r for r in self.rows.values() if r.state != LIVE and r.host == host and r.pid is not None]

    def forget_process(self, instance_id: str, pid: int) -> None:
        self.rows[instance_id] = replace(self.rows[instance_id], pid=None)

    def renew(self, instance_ids: Sequence[str], until: float) -> None:
        for instance_id in instance_ids:
            self.rows[instance_id] = replace(self.rows[instance_id], lease_expires_at=until)

    def use(self) -> PoolUse:
        live = self.live()
        return PoolUse({r.host: sum(1 for x in live if x.host == r.host) for r in live},
                       {r.tenant_id: sum(1 for x in live if x.tenant_id == r.tenant_id) for r in live},
                       {r.host: sum(len(x.ports) for x in live if x.host == r.host) for r in live if r.ports})

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        self.events.append((run_id, event, detail))

    def write_audit(self, tx: Tx, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        self.events.append((run_id, event, detail))


class FakeProcesses:
    """InstanceProcesses whose processes live until the test says they are gone."""

    def __init__(self) -> None:
        self.gone: set[int] = set()
        self.stopped: list[int] = []

    def alive(self, holder: Holder) -> bool:
        return holder.pid is None or holder.pid not in self.gone

    def stop(self, holder: Holder) -> bool:
        assert holder.pid is not None
        self.stopped.append(holder.pid)
        self.gone.add(holder.pid)
        return True


class KeptSandbox:
    """A Sandbox whose kept instances are fake processes with increasing pids."""

    isolation = "bwrap"

    def __init__(self, provider: str = "local", first_pid: int = 1000) -> None:
        self.provider = provider
        self.pid = first_pid

    def run(self, job: SandboxJob) -> SandboxOutcome:
        return SandboxOutcome(ok=True, isolation=self.isolation)

    def start_instance(self, job: SandboxJob) -> Holder:
        self.pid += 1
        return Holder(self.pid, 7)

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        return self.run(job)


class Costs:
    """A CostBook that keeps what it is given."""

    def __init__(self) -> None:
        self.booked: list[CostTrace] = []

    def record(self, cost: CostTrace) -> None:
        self.booked.append(cost)

    def record_in(self, tx: Tx, cost: CostTrace) -> None:
        self.booked.append(cost)


@pytest.fixture
def parts() -> tuple[SandboxPool, MemoryInstances, FakeProcesses, Costs]:
    instances, processes, costs = MemoryInstances(FakeClock(1_000.0)), FakeProcesses(), Costs()
    settings = PoolSettings(host="h1", host_cap=3, tenant_cap=5, port_range=(42000, 42001))
    pool = SandboxPool(instances, processes, settings, owner="h1:1", ledger=costs, price_per_s=0.5)
    return pool, instances, processes, costs


def job(run_id: str) -> SandboxJob:
    return SandboxJob(skill_id="test.devserver", function="serve", arguments={}, context={"run_id": run_id},
                      workdir=Path("/nonexistent"), wall_s=5)


def lease(pool: SandboxPool, sandbox: KeptSandbox, run_id: str, *, wait_s: float = 1.0) -> Any:
    return pool.lease(sandbox, job(run_id), tenant_id="t1", user_id="u1", persistent=True, ports=1,
                      deadline=time.monotonic() + wait_s)


def test_a_kept_instance_is_reused_then_recreated_when_its_process_is_gone(parts: Any) -> None:
    """A Run's second call reuses its instance; once its process is gone the next call re-creates it with
    the same ports, and the re-creation is audited with the reason."""
    pool, instances, processes, _ = parts
    sandbox = KeptSandbox()
    first = lease(pool, sandbox, "r1")
    assert first.event == "created" and first.env["HARNESS_PORTS"] == "42000"
    assert lease(pool, sandbox, "r1").event == "reused"
    processes.gone.add(first.holder.pid)
    again = lease(pool, sandbox, "r1")
    assert again.event == "recreated" and again.row.ports == first.row.ports and again.row.generation == 2
    assert instances.events[-1][1] == "sandbox_instance_recreated"
    assert instances.events[-1][2]["reason"] == "its process was gone"


def test_a_full_pool_reclaims_a_dead_instance_before_giving_up(parts: Any) -> None:
    """With the host's port pool used up, a call reclaims an instance whose process is gone and takes its
    units; when nothing can be reclaimed it fails naming what was full."""
    pool, instances, processes, _ = parts
    sandbox = KeptSandbox()
    dead = lease(pool, sandbox, "r1")
    lease(pool, sandbox, "r2")
    with pytest.raises(SandboxUnavailableError, match="port pool") as refused:
        lease(pool, sandbox, "r3", wait_s=0.05)
    assert "port pool" in refused.value.resource
    processes.gone.add(dead.holder.pid)
    assert lease(pool, sandbox, "r3").row.ports == dead.row.ports
    assert instances.get("r1", "test.devserver").state == DEAD


def test_the_close_releases_bills_once_and_stops_the_process_after_the_commit(parts: Any) -> None:
    """Entering TRACING releases the Run's instance and books its held seconds once, through the ledger
    port; its process is stopped only when the change has committed."""
    pool, instances, processes, costs = parts
    sandbox = KeptSandbox()
    held = lease(pool, sandbox, "r1")
    instances.clock.advance(10)
    tx = object()
    pool.on_transition(tx, "r1", RunState.EXECUTING, RunState.TRACING)
    pool.on_transition(tx, "r1", RunState.EXECUTING, RunState.TRACING)
    assert instances.get("r1", "test.devserver").state == RELEASED
    assert [(c.sandbox_s, c.usd) for c in costs.booked] == [(10.0, 5.0)]
    assert processes.stopped == []
    pool.after_change("r1", RunState.EXECUTING, RunState.TRACING)
    assert processes.stopped == [held.holder.pid]


def test_a_remote_instance_is_asked_after_and_stopped_through_its_provider() -> None:
    """An instance a sandbox server started is looked at and stopped through that provider, never through
    this host's processes (its pid means nothing here); a call that switches provider ends it (stopping its
    process where it runs) and starts a new one; a process without that provider leaves it alone."""
    instances, here, server = MemoryInstances(FakeClock(1_000.0)), FakeProcesses(), FakeProcesses()
    settings = PoolSettings(host="h1", host_cap=3, tenant_cap=5, port_range=(42000, 42001))
    pool = SandboxPool(instances, here, settings, owner="h1:1", providers={"remote": server})
    remote, local = KeptSandbox("remote", first_pid=50), KeptSandbox()
    first = lease(pool, remote, "r1")
    assert first.row.provider == "remote" and first.event == "created"
    here.gone.add(first.holder.pid)  # the same pid on this host is no process of the instance
    assert lease(pool, remote, "r1").event == "reused"
    assert pool.reclaim_dead() == 0
    row = instances.get("r1", "test.devserver")
    assert row is not None and row.state == LIVE

    other = SandboxPool(instances, FakeProcesses(), settings, owner="h1:2")  # no remote provider here
    assert other.reclaim_dead() == 0 and other.stop_ended() == 0
    row = instances.get("r1", "test.devserver")
    assert row is not None and row.state == LIVE

    moved = lease(pool, local, "r1")
    assert moved.event == "recreated" and moved.row.provider == "local"
    assert server.stopped == [first.holder.pid] and here.stopped == []
    ended = [d for _, event, d in instances.events if event == "sandbox_instance_recreated"]
    assert ended[-1]["reason"] == "the sandbox provider changed from remote to local"

    second = lease(pool, remote, "r2")
    pool.on_transition(object(), "r2", RunState.EXECUTING, RunState.TRACING)
    pool.after_change("r2", RunState.EXECUTING, RunState.TRACING)
    assert server.stopped == [first.holder.pid, second.holder.pid] and here.stopped == []
