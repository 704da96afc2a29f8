"""The webhook outbox (SPEC P4 / N1): deliveries queued with the change they tell about, claimed under a lease.

A delivery is one event for one endpoint. `enqueue` runs inside the transaction of the state change (or
approval request) the event describes, so the event commits exactly when the change does. Delivery
processes `claim` due rows in a short transaction of their own — SELECT … FOR UPDATE SKIP LOCKED on
PostgreSQL and MariaDB, the database write lock (BEGIN IMMEDIATE) on SQLite — setting a lease and counting
the attempt before anything is sent; so two processes never hold one delivery at once, and a process
that dies mid-send leaves a row whose lease runs out and that another process sends again (at least once,
with the same webhook-id). Outcomes are written only by the lease holder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q
from harness.adapters.sql.database import connection_of
from harness.adapters.sql.documents import unpack
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.store import SqlStore
from harness.domain.chain import canonical_json
from harness.domain.ids import ordered_id
from harness.domain.webhooks import DEAD, DELIVERED, PENDING, STATUSES, Delivery, OutgoingEvent
from harness.ports import Tx

_SNAPSHOT = sa.select(t.runs.c.tenant_id, t.runs.c.user_id, t.runs.c.state, t.runs.c.request, t.runs.c.result,
                      t.runs.c.parent_run_id).where(t.runs.c.run_id == sa.bindparam("p_run_id"))

w = t.webhook_deliveries


def _delivery(m: Mapping[Any, Any]) -> Delivery:
    return Delivery(
        delivery_id=m["delivery_id"], event_id=m["event_id"], event_type=m["event_type"], run_id=m["run_id"],
        tenant_id=m["tenant_id"], endpoint=m["endpoint"], url=m["url"], payload=m["payload"], status=m["status"],
        attempts=int(m["attempts"]), next_attempt_at=float(m["next_attempt_at"]), last_status=m["last_status"],
        last_error=m["last_error"], created_at=float(m["created_at"]), delivered_at=m["delivered_at"],
    )


class WebhookOutbox:
    """Queues, claims and settles webhook deliveries, and reads what a notifier needs inside a transaction."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.clock = store.clock
        self._skip_locked = store.engine.dialect.name != "sqlite"  # SQLite: the write lock serialises claims

    # ------------------------------------------------------------------ queueing (inside the change's tx)

    def enqueue(self, tx: Tx, events: Sequence[OutgoingEvent]) -> None:
        """Queue deliveries inside the caller's transaction: they commit with it or not at all."""
        if not events:
            return
        conn = connection_of(tx)
        now = self.store.clock.now()
        conn.execute(w.insert(), [{
            "delivery_id": ordered_id(), "event_id": e.event_id, "event_type": e.event_type, "run_id": e.run_id,
            "tenant_id": e.tenant_id, "endpoint": e.endpoint, "url": e.url, "payload": canonical_json(e.payload),
            "status": PENDING, "attempts": 0, "next_attempt_at": now, "created_at": now,
        } for e in events])

    @staticmethod
    def run_snapshot(tx: Tx, run_id: str) -> tuple[dict[str, Any], list[str]] | None:
        """(run columns, path of states) of a Run as this transaction sees it; None for no such Run.
        Read at every park and close, on the DBAPI cursor (plain text and string columns), in one round trip."""
        conn = connection_of(tx)
        raw = statements_for(conn.dialect)
        found, steps = raw.fetch_each(conn, (_SNAPSHOT, {"p_run_id": run_id}), (q.PATH_OF, {"p_run_id": run_id}))
        if not found:
            return None
        tenant_id, user_id, state, request, result, parent_run_id = found[0]
        path = [str(r[0]) for r in steps]
        return {"tenant_id": tenant_id, "user_id": user_id, "state": state, "request": json.loads(request),
                "result": json.loads(result) if result else None, "parent_run_id": parent_run_id}, path

    @staticmethod
    def run_context(tx: Tx, run_id: str) -> dict[str, Any] | None:
        """The Run's RunContext as this transaction sees it (None for none): read at a cancel's close only."""
        found = connection_of(tx).execute(sa.select(t.runs.c.context).where(t.runs.c.run_id == run_id)).first()
        return unpack(found[0], run_id) if found is not None else None

    @staticmethod
    def latest_request(tx: Tx, run_id: str) -> dict[str, Any] | None:
        """The Run's newest approval request as this transaction sees it, with its accepted approvers."""
        conn = connection_of(tx)
        r = t.hitl_requests
        row = conn.execute(sa.select(r).where(r.c.run_id == run_id)
                           .order_by(r.c.created_at.desc(), r.c.request_id.desc()).limit(1)).first()
        if row is None:
            return None
        found = dict(row._mapping)
        d = t.hitl_decisions
        found["decisions"] = [dict(m) for m in conn.execute(
            sa.select(d.c.approver, d.c.decision, d.c.break_glass, d.c.reason)
            .where(d.c.request_id == found["request_id"], d.c.outcome == "accepted").order_by(d.c.id)).mappings()]
        return found

    # ------------------------------------------------------------------ delivering

    def claim(self, owner: str, *, limit: int, lease_s: float, max_attempts: int) -> list[Delivery]:
        """Take up to `limit` due deliveries for `owner` under a lease, counting their attempt, in one short
        transaction; first, deliveries whose last attempt's sender vanished are marked dead."""
        now = self.store.clock.now()
        due = sa.and_(w.c.status == PENDING, w.c.next_attempt_at <= now,
                      sa.or_(w.c.lease_expires_at.is_(None), w.c.lease_expires_at <= now))
        with self.store.engine.begin() as conn:
            conn.execute(w.update().where(due, w.c.attempts >= max_attempts).values(
                status=DEAD, lease_owner=None, lease_expires_at=None,
                last_error=sa.func.coalesce(w.c.last_error, "no outcome recorded")
                + " (last attempt's sender stopped)"))
            query = sa.select(w.c.id).where(due).order_by(w.c.next_attempt_at, w.c.id).limit(limit)
            if self._skip_locked:
                query = query.with_for_update(skip_locked=True)
            ids = list(conn.execute(query).scalars())
            if not ids:
                return []
            conn.execute(w.update().where(w.c.id.in_(ids)).values(
                lease_owner=owner, lease_expires_at=now + lease_s, attempts=w.c.attempts + 1))
            rows = conn.execute(sa.select(w).where(w.c.id.in_(ids)).order_by(w.c.next_attempt_at, w.c.id)).mappings()
            return [_delivery(m) for m in rows]

    def delivered(self, owner: str, delivery_id: str, status_code: int) -> bool:
        """Record a successful send; False when `owner` no longer held the lease (someone else took it)."""
        return self._settle(owner, delivery_id, status=DELIVERED, delivered_at=self.store.clock.now(),
                            last_status=status_code, last_error=None)

    def failed(self, owner: str, delivery_id: str, *, error: str, status_code: int | None,
               retry_at: float | None) -> bool:
        """Record a failed attempt: retried at `retry_at`, or dead when None. False when the lease was lost."""
        values: dict[str, Any] = {"last_error": error[:2000], "last_status": status_code}
        if retry_at is None:
            values["status"] = DEAD
        else:
            values["next_attempt_at"] = retry_at
        return self._settle(owner, delivery_id, **values)

    def _settle(self, owner: str, delivery_id: str, **values: Any) -> bool:
        with self.store.engine.begin() as conn:
            return conn.execute(w.update().where(
                w.c.delivery_id == delivery_id, w.c.lease_owner == owner, w.c.status == PENDING,
            ).values(lease_owner=None, lease_expires_at=None, **values)).rowcount == 1

    def redeliver(self, delivery_id: str, *, tenant_id: str | None, actor: str) -> Delivery | None:
        """Queue a dead delivery again, from a fresh attempt count, with the same ids (the receiver never
        took it, so it dedupes nothing); the action is audited. None when there is no dead delivery with
        this id (in the tenant)."""
        now = self.store.clock.now()
        scope = [w.c.delivery_id == delivery_id, w.c.status == DEAD]
        if tenant_id is not None:
            scope.append(w.c.tenant_id == tenant_id)
        with self.store.engine.begin() as conn:
            moved = conn.execute(w.update().where(*scope).values(
                status=PENDING, attempts=0, next_attempt_at=now, lease_owner=None, lease_expires_at=None,
                delivered_at=None)).rowcount
            if moved != 1:
                return None
            found = _delivery(conn.execute(sa.select(w).where(w.c.delivery_id == delivery_id)).mappings().one())
            self.store.write_audit(conn, found.run_id, "webhook_redelivered", actor, {
                "delivery_id": delivery_id, "event_id": found.event_id, "endpoint": found.endpoint})
        return found

    # ------------------------------------------------------------------ reads

    def get(self, delivery_id: str, tenant_id: str | None = None) -> Delivery | None:
        """One delivery (in the tenant, when given)."""
        query = sa.select(w).where(w.c.delivery_id == delivery_id)
        if tenant_id is not None:
            query = query.where(w.c.tenant_id == tenant_id)
        with self.store.reader.connect() as conn:
            row = conn.execute(query).mappings().first()
        return _delivery(row) if row is not None else None

    def list(self, *, tenant_id: str | None = None, status: str | None = None, run_id: str | None = None,
             limit: int = 100) -> list[Delivery]:
        """Deliveries, newest first, optionally of one tenant, status or Run."""
        query = sa.select(w).order_by(w.c.id.desc()).limit(limit)
        if tenant_id is not None:
            query = query.where(w.c.tenant_id == tenant_id)
        if status is not None:
            query = query.where(w.c.status == status)
        if run_id is not None:
            query = query.where(w.c.run_id == run_id)
        with self.store.reader.connect() as conn:
            return [_delivery(m) for m in conn.execute(query).mappings()]

    def counts(self, tenant_id: str | None = None) -> dict[str, int]:
        """How many deliveries are in each status."""
        query = sa.select(w.c.status, sa.func.count()).group_by(w.c.status)
        if tenant_id is not None:
            query = query.where(w.c.tenant_id == tenant_id)
        with self.store.reader.connect() as conn:
            found = {str(s): int(n) for s, n in conn.execute(query)}
        return {s: found.get(s, 0) for s in STATUSES}
