"""Sandbox instances and the scarce units they hold, in the database (revision 0015).

An instance row is what any process sharing the database knows of a Run's sandbox for one skill: the
host it lives on, its process (pid and start time), its leased ports, how often it was (re)created,
and whether it is live, released (its Run closed) or dead (its process went away, or its host stopped
renewing it). The scarce units are rows of `sandbox_leases` keyed by (resource, unit): a port of a host's
pool, a slot of the host's cap, a slot of the tenant's cap. Taking units is one transaction that inserts
their rows; the primary key refuses a unit two processes raced for, and the loser tries again with what
is left, so no cap or port is ever handed out twice on any backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import connection_of
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.store import SqlStore
from harness.domain.sandbox import (
    LIVE,
    Capacity,
    Claim,
    InstanceRow,
    PoolUse,
    ShortageError,
)
from harness.ports import Clock, Tx

#: the domain's names, importable from here as before
__all__ = ["InstanceTable", "instance_id_of"]

instances, leases = t.sandbox_instances, t.sandbox_leases
_RACE_RETRIES = 8


def _instance(row: Mapping[Any, Any]) -> InstanceRow:
    """An instance from a row's columns by name."""
    values = dict(row)
    values["ports"] = tuple(int(p) for p in values["ports"].split(",") if p)
    values["persistent"], values["billed"] = bool(values["persistent"]), bool(values["billed"])
    return InstanceRow(**values)


_OF_RUN = sa.select(instances).where(instances.c.run_id == sa.bindparam("p_run"))


def instance_id_of(run_id: str, skill_id: str) -> str:
    """The stable id of a Run's instance for a skill (the pair can be longer than an id column)."""
    return "sbx-" + hashlib.sha256(f"{run_id}\0{skill_id}".encode()).hexdigest()[:40]


class InstanceTable:
    """Reads and writes of instance rows and their leases (ports.sandboxes.SandboxInstances), and the audit
    events the pool writes about them."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        self.store.audit(run_id, event, actor, detail)

    def write_audit(self, tx: Tx, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        self.store.write_audit(connection_of(tx), run_id, event, actor, detail)

    def get(self, run_id: str, skill_id: str) -> InstanceRow | None:
        """The Run's instance for the skill, whatever its state; None when it never had one."""
        query = sa.select(instances).where(instances.c.run_id == run_id, instances.c.skill_id == skill_id)
        with self.store.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else _instance(row._mapping)

    def acquire(self, claim: Claim, capacity: Capacity, now: float, lease_until: float) -> InstanceRow:
        """Take the claim's units and make its row live (a new row, or the next generation of a row whose
        instance ended). Raises ShortageError naming the first resource with too few free units."""
        for attempt in range(_RACE_RETRIES):
            try:
                with self.store.engine.begin() as conn:
                    return self._acquire(conn, claim, capacity, now, lease_until)
            except (sa.exc.IntegrityError, sa.exc.OperationalError):
                if attempt == _RACE_RETRIES - 1:
                    raise  # another process took the same units every time: not a shortage, a failure
        raise AssertionError("unreachable")

    def _acquire(self, conn: sa.Connection, claim: Claim, capacity: Capacity, now: float,
                 lease_until: float) -> InstanceRow:
        instance_id = instance_id_of(claim.run_id, claim.skill_id)
        ports: list[int] = []
        taken: list[dict[str, Any]] = []
        for resource, name, units, count in capacity.needs(claim):
            held = set(conn.execute(sa.select(leases.c.unit).where(leases.c.resource == resource)).scalars())
            free = [u for u in units if u not in held][:count]
            if len(free) < count:
                raise ShortageError(name)
            taken += [{"resource": resource, "unit": u, "instance_id": instance_id, "acquired_at": now} for u in free]
            if resource.startswith("port:"):
                ports = free
        conn.execute(leases.insert(), taken)
        values = {"tenant_id": claim.tenant_id, "user_id": claim.user_id, "host": claim.host, "state": LIVE,
                  "isolation": claim.isolation, "pid": None, "pid_start": None, "owner": claim.owner,
                  "ports": ",".join(str(p) for p in ports), "persistent": claim.persistent,
                  "started_at": now, "used_at": now, "lease_expires_at": lease_until, "ended_at": None,
                  "end_reason": None, "provider": claim.provider}
        done = conn.execute(instances.update().where(instances.c.instance_id == instance_id,
                                                     instances.c.state != LIVE)
                            .values(generation=instances.c.generation + 1, **values))
        if done.rowcount == 0:
            conn.execute(instances.insert().values(instance_id=instance_id, run_id=claim.run_id,
                                                   skill_id=claim.skill_id, created_at=now, **values))
        row = conn.execute(sa.select(instances).where(instances.c.instance_id == instance_id)).one()
        return _instance(row._mapping)

    def started(self, instance_id: str, pid: int | None, pid_start: int | None, now: float, *,
                new_generation: bool = False) -> InstanceRow:
        """Note the instance's process and count the call it starts for (and, for a re-creation that kept
        its units, the next generation)."""
        values: dict[str, Any] = {"pid": pid, "pid_start": pid_start, "started_at": now, "used_at": now,
                                  "calls": instances.c.calls + 1}
        with self.store.engine.begin() as conn:
            if new_generation:
                row = conn.execute(sa.select(instances).where(instances.c.instance_id == instance_id)).one()
                values["held_s"] = _instance(row._mapping).held_until(now)
                values["generation"] = instances.c.generation + 1
            conn.execute(instances.update().where(instances.c.instance_id == instance_id).values(**values))
            return _instance(conn.execute(sa.select(instances).where(
                instances.c.instance_id == instance_id)).mappings().one())

    def touch(self, instance_id: str, now: float, lease_until: float) -> None:
        """Count a call and renew the instance's lease."""
        with self.store.engine.begin() as conn:
            conn.execute(instances.update().where(instances.c.instance_id == instance_id)
                         .values(calls=instances.c.calls + 1, used_at=now, lease_expires_at=lease_until))

    def end(self, tx: Tx, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        """End a live instance (released or dead) and free its units, in the caller's transaction; False
        when it was no longer live (another process ended it first)."""
        conn = connection_of(tx)
        current = (instances.c.instance_id == row.instance_id, instances.c.state == LIVE,
                   instances.c.started_at == row.started_at)
        done = conn.execute(instances.update().where(*current)
                            .values(state=state, end_reason=reason[:200], ended_at=now,
                                    held_s=row.held_until(now)))
        if done.rowcount == 0:
            return False
        conn.execute(leases.delete().where(leases.c.instance_id == row.instance_id))
        return True

    def end_now(self, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        """`end` in a transaction of its own."""
        with self.store.engine.begin() as conn:
            return self.end(conn, row, state, reason, now)

    def of_run(self, tx: Tx, run_id: str) -> list[InstanceRow]:
        """The Run's instances (any state), inside the caller's transaction."""
        conn = connection_of(tx)  # at every close: on the cursor, the statement built once
        return [_instance(r) for r in statements_for(conn.dialect).mappings(conn, _OF_RUN, {"p_run": run_id})]

    def mark_billed(self, tx: Tx, instance_id: str) -> None:
        """The instance's held seconds are in the Run's costs."""
        connection_of(tx).execute(instances.update().where(instances.c.instance_id == instance_id).values(billed=True))

    def live(self, host: str | None = None, *, tenant_id: str | None = None) -> list[InstanceRow]:
        """Live instances, of one host (and one tenant) or of all, oldest first."""
        query = sa.select(instances).where(instances.c.state == LIVE).order_by(instances.c.created_at)
        if host is not None:
            query = query.where(instances.c.host == host)
        if tenant_id is not None:
            query = query.where(instances.c.tenant_id == tenant_id)
        with self.store.engine.connect() as conn:
            return [_instance(r) for r in conn.execute(query).mappings()]

    def ended_with_process(self, host: str) -> list[InstanceRow]:
        """Ended instances of this host whose process may still run (nobody has stopped it yet)."""
        query = sa.select(instances).where(instances.c.state != LIVE, instances.c.host == host,
                                           instances.c.pid.is_not(None))
        with self.store.engine.connect() as conn:
            return [_instance(r) for r in conn.execute(query).mappings()]

    def forget_process(self, instance_id: str, pid: int) -> None:
        """The ended instance's process is gone."""
        with self.store.engine.begin() as conn:
            conn.execute(instances.update().where(instances.c.instance_id == instance_id, instances.c.pid == pid,
                                                  instances.c.state != LIVE).values(pid=None))

    def renew(self, instance_ids: Sequence[str], until: float) -> None:
        """Extend the leases of instances whose process was seen alive."""
        if instance_ids:
            with self.store.engine.begin() as conn:
                conn.execute(instances.update().where(instances.c.instance_id.in_(list(instance_ids)),
                                                      instances.c.state == LIVE).values(lease_expires_at=until))

    def use(self) -> PoolUse:
        """What every host holds now."""
        with self.store.engine.connect() as conn:
            by_host = conn.execute(sa.select(instances.c.host, sa.func.count()).where(instances.c.state == LIVE)
                                   .group_by(instances.c.host)).all()
            by_tenant = conn.execute(sa.select(instances.c.tenant_id, sa.func.count())
                                     .where(instances.c.state == LIVE).group_by(instances.c.tenant_id)).all()
            ports = conn.execute(sa.select(leases.c.resource, sa.func.count())
                                 .where(leases.c.resource.like("port:%")).group_by(leases.c.resource)).all()
        return PoolUse({h: int(n) for h, n in by_host}, {tn: int(n) for tn, n in by_tenant},
                       {r.removeprefix("port:"): int(n) for r, n in ports})
