"""Sandboxes as a scarce resource (seed 004 §3.4-3.5): one instance per (Run, sandboxed skill), a
port pool per host, caps per host and per tenant.

A Run's first call of a sandboxed skill takes an instance: a slot of the host's cap, a slot of its
tenant's cap and the ports its manifest asks for, all in one transaction of the instance store. The Run keeps
it for its later calls of that skill — through a wait for approval and across restarts of the harness
process — and gives it back when it enters TRACING, in that transaction. A `persistent` skill's instance
also keeps a process holding its namespaces (the InstanceProcesses port of the provider that started it:
this host's, or a sandbox server's for the remote provider): when that process is
found gone at the next call (the machine restarted, someone killed it), the instance is re-created over
the Run's preserved working directory, with the same ports when they were still its, and the
re-creation is in the Run's audit trail.

A call that finds no free unit waits for one within its step's time limit, reclaiming the units of dead
instances as it goes (a process that is gone, a host that stopped renewing its leases), and then fails
with `sandbox_unavailable` naming what was full. It never runs outside a sandbox.

This module is the policy: which instance a call gets, within which limits, how long it waits, when one is
dead. Where instances are kept (ports.sandboxes.SandboxInstances), how their processes are looked at and
stopped (ports.sandboxes.InstanceProcesses) and where their seconds are booked (ports.ledger.CostBook) are
ports, wired by the composition root.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from harness.domain.sandbox import (
    DEAD,
    LIVE,
    RELEASED,
    Capacity,
    Claim,
    Holder,
    InstanceRow,
    PoolSettings,
    SandboxJob,
    ShortageError,
)
from harness.domain.traces import CostTrace
from harness.kernel.states import RunState
from harness.ports import Clock, Sandbox, Tx
from harness.ports.ledger import CostBook
from harness.ports.sandboxes import InstanceProcesses, SandboxInstances

log = logging.getLogger("harness.sandbox")
ACTOR = "sandbox_pool"
#: a bwrap instance whose process was never noted this long after its units were taken is dead
START_GRACE_S = 60.0


class SandboxUnavailableError(Exception):
    """No sandbox could be had within the step's time limit."""

    def __init__(self, message: str, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


@dataclass(frozen=True)
class Lease:
    """What a call got: the instance's row, its process, the variables the skill sees, the seconds it
    waited, and what happened ("created", "reused", "recreated")."""

    row: InstanceRow
    holder: Holder
    env: dict[str, str]
    waited_s: float
    event: str


def port_env(row: InstanceRow) -> dict[str, str]:
    """The leased ports as the skill sees them: HARNESS_PORTS (comma-separated), HARNESS_PORT_0 …"""
    env = {"HARNESS_SANDBOX_INSTANCE": row.instance_id, "HARNESS_SANDBOX_GENERATION": str(row.generation)}
    if row.ports:
        env["HARNESS_PORTS"] = ",".join(str(p) for p in row.ports)
        env.update({f"HARNESS_PORT_{i}": str(p) for i, p in enumerate(row.ports)})
    return env


class SandboxPool:
    """Hands out, keeps, releases and reclaims sandbox instances for one host."""

    def __init__(self, instances: SandboxInstances, processes: InstanceProcesses, settings: PoolSettings, *,
                 owner: str, ledger: CostBook | None = None, price_per_s: float = 0.0,
                 price_table: str | None = None, providers: Mapping[str, InstanceProcesses] | None = None) -> None:
        #: where instances and their units are kept (and their audit events written)
        self.table = instances
        #: the processes of kept instances, by the provider that started them: this host's ("local") and
        #: those of the other providers this process may use (a sandbox server's, "remote")
        self.processes: dict[str, InstanceProcesses] = {**(providers or {}), "local": processes}
        self.settings = settings
        self.owner = owner
        self.ledger = ledger
        self.price_per_s = price_per_s
        self.price_table = price_table
        self.capacity = Capacity(settings.host_cap, settings.tenant_cap, settings.port_range)
        #: Runs whose entry into TRACING ended an instance with a process on this host
        self._to_stop: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @property
    def clock(self) -> Clock:
        """The instance store's clock (leases and held seconds are timed on it)."""
        return self.table.clock

    # ------------------------------------------------------------------ taking one

    def lease(self, sandbox: Sandbox, job: SandboxJob, *, tenant_id: str, user_id: str, persistent: bool,
              ports: int, deadline: float) -> Lease:
        """The Run's instance for the job's skill, waiting until time.monotonic() reaches `deadline` for
        units to be free. Raises SandboxUnavailableError (traced) when none came in time."""
        with self._lock_of(job.run_id, job.skill_id):  # parallel steps of a Run share one instance
            return self._lease(sandbox, job, tenant_id, user_id, persistent, ports, deadline)

    def _lock_of(self, run_id: str, skill_id: str) -> threading.Lock:
        with self._locks_lock:
            if len(self._locks) > 10_000:  # forget the locks of long-gone Runs (none is held between calls)
                self._locks.clear()
            return self._locks.setdefault(f"{run_id}\0{skill_id}", threading.Lock())

    def _lease(self, sandbox: Sandbox, job: SandboxJob, tenant_id: str, user_id: str, persistent: bool,
               ports: int, deadline: float) -> Lease:
        began = time.monotonic()
        run_id, skill_id, host = job.run_id, job.skill_id, self.settings.host
        row = self.table.get(run_id, skill_id)
        provider = getattr(sandbox, "provider", "local")
        reason = None
        if row is not None and row.state == LIVE and row.host == host and row.provider != provider:
            reason = f"the sandbox provider changed from {row.provider} to {provider}"
            self._end_changed(row, reason)
        elif row is not None and row.state == LIVE and row.host == host and row.isolation != sandbox.isolation:
            reason = f"the sandbox changed from {row.isolation} to {sandbox.isolation}"
            self._end_changed(row, reason)
        elif row is not None and row.state == LIVE and row.host == host:
            holder = Holder(row.pid, row.pid_start)
            has_process = persistent and row.isolation == "bwrap"
            if not has_process or (row.pid is not None and self._alive(row)):
                self.table.touch(row.instance_id, self.clock.now(), self._lease_until())
                return Lease(row, holder, port_env(row), 0.0, "reused")
            if row.pid is not None:
                return self._restart(sandbox, job, row, "its process was gone", began)
            reason = "its start did not finish"
            self.table.end_now(row, DEAD, reason, self.clock.now())
        elif row is not None and row.state == LIVE:
            reason = f"it lived on host {row.host}; the Run now runs on {host}"
            self.table.end_now(row, DEAD, reason, self.clock.now())
        elif row is not None:
            reason = row.end_reason or f"it was {row.state}"
        claim = Claim(run_id, skill_id, tenant_id, user_id, host, sandbox.isolation, persistent, ports, self.owner,
                      provider)
        row = self._acquire(claim, began, deadline)
        event = "created" if row.generation == 1 else "recreated"
        holder = self._start(sandbox, job, row, persistent)
        row = self.table.started(row.instance_id, holder.pid, holder.pid_start, self.clock.now())
        self._audit(row, event, began, reason)
        return Lease(row, holder, port_env(row), time.monotonic() - began, event)

    def _restart(self, sandbox: Sandbox, job: SandboxJob, row: InstanceRow, reason: str, began: float) -> Lease:
        """Re-create a live instance whose process is gone, keeping its units (its ports stay the same)."""
        holder = self._start(sandbox, job, row, True)
        row = self.table.started(row.instance_id, holder.pid, holder.pid_start, self.clock.now(),
                                 new_generation=True)
        self._audit(row, "recreated", began, reason)
        return Lease(row, holder, port_env(row), time.monotonic() - began, "recreated")

    def _start(self, sandbox: Sandbox, job: SandboxJob, row: InstanceRow, persistent: bool) -> Holder:
        if not persistent:
            return Holder()
        try:
            return sandbox.start_instance(job)
        except Exception as exc:  # the units go back; the call fails with the reason
            self.table.end_now(row, DEAD, f"its start failed: {exc}", self.clock.now())
            raise SandboxUnavailableError(f"the sandbox instance for {job.skill_id} could not start: {exc}",
                                          "start") from exc

    def _acquire(self, claim: Claim, began: float, deadline: float) -> InstanceRow:
        pause, reclaimed_at = 0.01, 0.0
        while True:
            try:
                return self.table.acquire(claim, self.capacity, self.clock.now(), self._lease_until())
            except ShortageError as short:
                if time.monotonic() - reclaimed_at > 0.2:
                    reclaimed_at = time.monotonic()
                    if self.reclaim_dead():
                        continue
                if time.monotonic() + pause >= deadline:
                    waited = time.monotonic() - began
                    message = (f"no sandbox for {claim.skill_id}: {short.resource} is fully in use; waited "
                               f"{waited:.3g}s, the step's time limit")
                    self.table.audit(claim.run_id, "sandbox_unavailable", ACTOR, {
                        "skill": claim.skill_id, "resource": short.resource, "waited_s": round(waited, 3),
                        "host": claim.host})
                    raise SandboxUnavailableError(message, short.resource) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.25)

    def _end_changed(self, row: InstanceRow, reason: str) -> None:
        """End a live instance the call can no longer use (its provider or its isolation changed); its
        process, if any, is stopped by the provider that started it."""
        if self.table.end_now(row, DEAD, reason, self.clock.now()) and row.pid is not None:
            self.stop_ended(row.run_id)

    def _processes_of(self, row: InstanceRow) -> InstanceProcesses | None:
        """Who can look at and stop the row's process: the provider that started it; None when this process
        does not use that provider (it cannot tell whether the process runs)."""
        return self.processes.get(row.provider)

    def _alive(self, row: InstanceRow) -> bool:
        processes = self._processes_of(row)
        return processes is not None and processes.alive(Holder(row.pid, row.pid_start))

    def _lease_until(self) -> float:
        return self.clock.now() + self.settings.lease_s

    def _audit(self, row: InstanceRow, event: str, began: float, reason: str | None) -> None:
        detail = {"skill": row.skill_id, "instance_id": row.instance_id, "host": row.host, "pid": row.pid,
                  "ports": list(row.ports), "generation": row.generation, "isolation": row.isolation,
                  "start_ms": round((time.monotonic() - began) * 1000, 3)}
        if reason:
            detail["reason"] = reason
        self.table.audit(row.run_id, f"sandbox_instance_{event}", ACTOR, detail)

    # ------------------------------------------------------------------ giving back

    def on_transition(self, tx: Tx, run_id: str, _source: RunState, target: RunState) -> None:
        """Inside the transaction of a Run's entry into TRACING (or a final state reached another way):
        end its live instances, free their units, and record a kept instance's seconds as its cost."""
        if target is not RunState.TRACING:  # every close passes TRACING
            return
        now = self.clock.now()
        for row in self.table.of_run(tx, run_id):
            if row.state == LIVE and self.table.end(tx, row, RELEASED, "its Run is closing", now):
                self.table.write_audit(tx, run_id, "sandbox_instance_released", ACTOR, {
                    "skill": row.skill_id, "instance_id": row.instance_id, "held_s": round(row.held_until(now), 6),
                    "calls": row.calls, "generation": row.generation, "ports": list(row.ports)})
                if row.pid is not None and row.host == self.settings.host:
                    self._to_stop.add(run_id)  # once the change commits (a rollback leaves it running)
            if row.persistent and not row.billed:
                self._bill(tx, row, row.held_until(now))

    def _bill(self, tx: Tx, row: InstanceRow, seconds: float) -> None:
        if self.ledger is None:
            return
        price: dict[str, float | str] = {"sandbox_per_s": self.price_per_s}
        if self.price_table:
            price["table"] = self.price_table
        self.ledger.record_in(tx, CostTrace(
            run_id=row.run_id, source=f"sandbox_instance:{row.isolation}:{row.skill_id}", sandbox_s=round(seconds, 6),
            usd=round(seconds * self.price_per_s, 8), unit_price=price, tenant_id=row.tenant_id,
            user_id=row.user_id, skill_id=row.skill_id))
        self.table.mark_billed(tx, row.instance_id)

    def after_change(self, run_id: str, _source: RunState, target: RunState) -> None:
        """Once a Run's entry into TRACING committed, stop the processes of the instances it ended here."""
        if target is RunState.TRACING and run_id in self._to_stop:
            self._to_stop.discard(run_id)
            self.stop_ended(run_id)

    def stop_ended(self, run_id: str | None = None) -> int:
        """Stop this host's processes of ended instances (of one Run, or all); returns how many."""
        stopped = 0
        for row in self.table.ended_with_process(self.settings.host):
            ours = run_id is None or row.run_id == run_id
            processes = self._processes_of(row)
            if ours and row.pid is not None and processes is not None \
                    and processes.stop(Holder(row.pid, row.pid_start)):
                self.table.forget_process(row.instance_id, row.pid)
                stopped += 1
        return stopped

    # ------------------------------------------------------------------ reclaiming

    def reclaim_dead(self) -> int:
        """End instances that are dead: on this host, a kept instance whose process is gone; on any host,
        one whose lease nobody renewed in time. Renews the leases of this host's live ones. Returns how
        many were ended (their units are free again)."""
        now, host, ended = self.clock.now(), self.settings.host, 0
        renew: list[str] = []
        for row in self.table.live():
            reason = None
            if row.host == host:
                if row.persistent and row.pid is not None and self._processes_of(row) is None:
                    continue  # started by a provider this process does not use: its Run's close ends it
                if row.persistent and row.pid is not None and not self._alive(row):
                    reason = "its process was gone"
                elif row.persistent and row.pid is None and row.isolation == "bwrap" \
                        and now - row.started_at > START_GRACE_S:
                    reason = "its start did not finish"
                else:
                    renew.append(row.instance_id)
            elif row.lease_expires_at < now:
                reason = f"its host {row.host} stopped renewing its lease"
            if reason is not None and self.table.end_now(row, DEAD, reason, now):
                ended += 1
                self.table.audit(row.run_id, "sandbox_instance_reclaimed", ACTOR, {
                    "skill": row.skill_id, "instance_id": row.instance_id, "host": row.host, "reason": reason,
                    "ports": list(row.ports)})
        self.table.renew(renew, now + self.settings.lease_s)
        return ended

    def reclaim(self, final_among: Callable[[Sequence[str]], set[str]]) -> int:
        """The sweeper's pass: release the instances of Runs closed without this pool seeing it (another
        process's close, a database written by an older version), reclaim dead ones, stop the processes of
        ended ones. Returns how many instances were ended."""
        now, ended = self.clock.now(), self.reclaim_dead()
        mine = self.table.live(self.settings.host)
        closed = final_among(sorted({r.run_id for r in mine}))
        for row in mine:
            if row.run_id in closed and self.table.end_now(row, RELEASED, "its Run closed elsewhere", now):
                ended += 1
                self.table.audit(row.run_id, "sandbox_instance_released", ACTOR, {
                    "skill": row.skill_id, "instance_id": row.instance_id, "reason": "its Run closed elsewhere"})
        self.stop_ended()
        return ended
