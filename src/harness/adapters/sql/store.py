"""The SQL store: the single write path for Run.state (SPEC K4) and the outbox-fed hash chain (A3, A4).

Every state change is one database transaction that compare-and-sets runs.state and writes the
transition row, the audit events, the legacy Job.status projection and the outbox records together.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q
from harness.adapters.sql.database import SQLITE_BUSY_TIMEOUT_MS, create_engine, migrate, read_only, resolve_url
from harness.adapters.sql.raw import RawStatements
from harness.audit import commitment
from harness.audit.chain import canonical_json, record_hash
from harness.clock import SystemClock
from harness.errors import IdempotencyConflictError, InvalidTransitionError, StoreError, UnknownRunError
from harness.ids import ordered_id
from harness.kernel import (
    FINAL,
    RunState,
    audit_events_for,
    close_reason_on_entry,
    final_state_for,
    is_legal,
    job_status,
)
from harness.kernel.events import ILLEGAL_TRANSITION, LOST_RACE
from harness.kernel.states import CloseReason
from harness.ports import Clock, TraceBuffer

_log = logging.getLogger(__name__)

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class TraceRecordIn:
    """A record to append to the trace: written to the outbox, chained when drained."""

    kind: str
    payload: dict[str, Any]
    run_id: str | None = None
    #: assigned when the record is enqueued, unless given (a RunTrace names its closing transaction's)
    record_id: str | None = None


#: the kind of a Run's RunTrace record (SPEC A1)
RUN_TRACE = "run"


@dataclass(frozen=True, slots=True)
class NewRun:
    """What the store needs to create a Run."""

    tenant_id: str
    user_id: str
    session_id: str
    request: dict[str, Any]
    idempotency_key: str | None = None
    retry_of: str | None = None
    parent_run_id: str | None = None
    deadline_at: float | None = None
    run_id: str = field(default_factory=ordered_id)
    #: digest of the request body, bound to the idempotency key (harness.pipeline.intake.body_hash)
    request_hash: str | None = None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A Run as stored."""

    run_id: str
    tenant_id: str
    user_id: str
    session_id: str
    state: RunState
    close_reason: CloseReason | None
    version: int
    retry_of: str | None
    parent_run_id: str | None
    idempotency_key: str | None
    created_at: float
    last_state_change_at: float
    deadline_at: float | None
    lease_owner: str | None
    lease_epoch: int
    stall_count: int
    request: dict[str, Any]
    context: dict[str, Any] | None
    result: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """What a call to transition() did. `applied` is False when another writer got there first."""

    run_id: str
    source: RunState
    target: RunState
    applied: bool
    actual: RunState
    seq: int | None = None
    fenced: bool = False
    close_reason: CloseReason | None = None

    @property
    def lost_race(self) -> bool:
        """True when the compare-and-set found the Run no longer in `source` (or under another lease)."""
        return not self.applied


@dataclass(frozen=True, slots=True)
class TransitionRow:
    """One stored state change."""

    seq: int
    from_state: RunState | None
    to_state: RunState
    actor: str
    reason: str
    forced_by: str | None
    at: float


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One AuditLog event."""

    event_id: str
    run_id: str | None
    event: str
    actor: str
    detail: dict[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class StoredTraceRecord:
    """One chained trace record, exactly as stored."""

    seq: int
    record_id: str
    run_id: str | None
    kind: str
    payload: str
    prev_hash: str
    hash: str

    def data(self) -> dict[str, Any]:
        """The payload, parsed, with the record's run_id (stored once, in its own column: see `enqueue`)."""
        parsed: dict[str, Any] = json.loads(self.payload)
        if self.run_id is not None:
            parsed.setdefault("run_id", self.run_id)
        return parsed


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """A trace record waiting to be chained: an outbox row, or its copy in a trace buffer."""

    record_id: str
    run_id: str | None
    kind: str
    payload: str


class _WrongExitError(Exception):
    """TRACING asked to exit somewhere its close reason does not lead (rolls the transaction back)."""

    def __init__(self, reason: CloseReason | None) -> None:
        super().__init__(str(reason))
        self.reason = reason


class _CasRow(NamedTuple):
    state: str
    close_reason: str | None
    version: int
    lease_epoch: int


class _OutboxRow(NamedTuple):
    id: int
    record_id: str
    run_id: str | None
    kind: str
    payload: str


def _without_run_id(payload: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    if run_id is None or payload.get("run_id") != run_id:
        return payload
    return {k: v for k, v in payload.items() if k != "run_id"}


def _transition_of(m: dict[str, Any]) -> TransitionRow:
    source = RunState(m["from_state"]) if m["from_state"] else None
    return TransitionRow(m["seq"], source, RunState(m["to_state"]), m["actor"], m["reason"], m["forced_by"], m["at"])


def _run_from_row(row: sa.Row[Any]) -> RunRecord:
    return _run_of(row._mapping)


def _run_of(m: Mapping[Any, Any]) -> RunRecord:
    return RunRecord(
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        user_id=m["user_id"],
        session_id=m["session_id"],
        state=RunState(m["state"]),
        close_reason=CloseReason(m["close_reason"]) if m["close_reason"] else None,
        version=m["version"],
        retry_of=m["retry_of"],
        parent_run_id=m["parent_run_id"],
        idempotency_key=m["idempotency_key"],
        created_at=m["created_at"],
        last_state_change_at=m["last_state_change_at"],
        deadline_at=m["deadline_at"],
        lease_owner=m["lease_owner"],
        lease_epoch=m["lease_epoch"],
        stall_count=m["stall_count"],
        request=json.loads(m["request"]),
        context=json.loads(m["context"]) if m["context"] else None,
        result=json.loads(m["result"]) if m["result"] else None,
    )


class SqlStore:
    """Runs, transitions, audit events and the trace, on SQLite, PostgreSQL or MySQL/MariaDB."""

    def __init__(self, engine: sa.Engine, clock: Clock | None = None) -> None:
        self.engine = engine
        #: the same pool, for reads only: on SQLite they do not take the write lock
        self.reader = read_only(engine)
        self._batches_by_array = engine.dialect.name == "postgresql"
        self.clock: Clock = clock or SystemClock()
        self._locks_rows = engine.dialect.name != "sqlite"  # SQLite serializes with BEGIN IMMEDIATE
        self._raw = RawStatements(engine.dialect)
        #: carries the outbox to the chain through e.g. Redis Streams (SPEC D2); None: drained directly
        self.trace_buffer: TraceBuffer | None = None
        self._database_id: str | None = None

    @classmethod
    def open(cls, db: str | None = None, clock: Clock | None = None, *, migrate_schema: bool = True) -> SqlStore:
        """Open (and on first use create) the database named by `db`, HARNESS_DATABASE_URL or the default."""
        engine = create_engine(resolve_url(db))
        if migrate_schema:
            migrate(engine)
        return cls(engine, clock)

    def close(self) -> None:
        """Release every pooled connection."""
        if self.trace_buffer is not None:
            self.trace_buffer.close()
        self.engine.dispose()

    # ------------------------------------------------------------------ creating Runs

    def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Create a Run in CREATED, durably, and return it; with an idempotency key the same user of the
        tenant already used, return that Run instead (second value False) — or, when the key came with
        another request body (`request_hash`), raise IdempotencyConflictError."""
        if new.idempotency_key is not None:
            existing = self._existing_for_key(new)
            if existing is not None:
                return existing, False
        now = self.clock.now()
        request = canonical_json(new.request)
        try:
            with self.engine.begin() as conn:
                self._raw.execute(
                    conn,
                    q.RUN_INSERT,
                    {
                        "run_id": new.run_id,
                        "tenant_id": new.tenant_id,
                        "user_id": new.user_id,
                        "session_id": new.session_id,
                        "state": RunState.CREATED.value,
                        "close_reason": None,
                        "version": 0,
                        "retry_of": new.retry_of,
                        "parent_run_id": new.parent_run_id,
                        "idempotency_key": new.idempotency_key,
                        "created_at": now,
                        "last_state_change_at": now,
                        "deadline_at": new.deadline_at,
                        "lease_epoch": 0,
                        "stall_count": 0,
                        "request": request,
                        # named only when there is one: a Run without a body hash inserts exactly the columns
                        # it did before migration 0011 (the older migrations' tests drive Runs at old revisions)
                        **({"request_hash": new.request_hash} if new.request_hash is not None else {}),
                    },
                )
                self._write_change(conn, new.run_id, 0, None, RunState.CREATED, "run_manager", "run created", None,
                                   now, (), extra_audit={"tenant_id": new.tenant_id, "user_id": new.user_id,
                                                         "retry_of": new.retry_of, "session_id": new.session_id})
        except sa.exc.IntegrityError:
            if new.idempotency_key is not None:
                existing = self._existing_for_key(new)
                if existing is not None:
                    return existing, False
            raise
        # the row just committed, without reading it back: one transaction fewer per Run
        return RunRecord(
            run_id=new.run_id, tenant_id=new.tenant_id, user_id=new.user_id, session_id=new.session_id,
            state=RunState.CREATED, close_reason=None, version=0, retry_of=new.retry_of,
            parent_run_id=new.parent_run_id, idempotency_key=new.idempotency_key, created_at=now,
            last_state_change_at=now, deadline_at=new.deadline_at, lease_owner=None, lease_epoch=0,
            stall_count=0, request=json.loads(request), context=None, result=None,
        ), True

    def find_by_idempotency_key(self, tenant_id: str, user_id: str, key: str) -> RunRecord | None:
        """The Run this user of the tenant created with this idempotency key, if any."""
        found = self._by_key(tenant_id, user_id, key)
        return found[0] if found else None

    def _by_key(self, tenant_id: str, user_id: str, key: str) -> tuple[RunRecord, str | None] | None:
        with self.reader.connect() as conn:
            row = conn.execute(sa.select(*q.RUN_RECORD, t.runs.c.request_hash).where(
                t.runs.c.tenant_id == tenant_id, t.runs.c.user_id == user_id, t.runs.c.idempotency_key == key)).first()
        return (_run_of(row._mapping), row._mapping["request_hash"]) if row else None

    def _existing_for_key(self, new: NewRun) -> RunRecord | None:
        """The Run `new`'s idempotency key already names; IdempotencyConflictError when it was created from
        another body (a Run from before request hashes were kept has none and is returned as it was)."""
        assert new.idempotency_key is not None
        found = self._by_key(new.tenant_id, new.user_id, new.idempotency_key)
        if found is None:
            return None
        run, digest = found
        if new.request_hash is not None and digest is not None and digest != new.request_hash:
            raise IdempotencyConflictError(
                f"idempotency key {new.idempotency_key!r} was already used for run {run.run_id} with a different "
                "request; send the same request to get that Run back, or use a new key", run.run_id)
        return run

    # ------------------------------------------------------------------ the one write path

    def transition(
        self,
        run_id: str,
        source: RunState,
        target: RunState,
        *,
        actor: str,
        reason: str,
        forced_by: str | None = None,
        lease_epoch: int | None = None,
        expected_version: int | None = None,
        records: Sequence[TraceRecordIn] = (),
        context: dict[str, Any] | None = _UNSET,
        result: dict[str, Any] | None = _UNSET,
        also: Callable[[sa.Connection], object] | None = None,
    ) -> TransitionResult:
        """Compare-and-set Run.state from `source` to `target` (SPEC K4).

        `also` runs inside the same transaction once the compare-and-set has succeeded, for writes
        that must commit with the state change or not at all (e.g. opening an approval request).

        Illegal pairs raise InvalidTransitionError after auditing the attempt. When the Run is no
        longer in `source` (or `lease_epoch` no longer matches, K5b, or the Run changed since the caller
        read it at `expected_version` — the ABA case of a Run that left `source` and came back) nothing
        changes, the attempted decision is audited, and the result says the race was lost.
        """
        source, target = RunState(source), RunState(target)
        if not is_legal(source, target):
            self._audit_illegal(run_id, source, target, actor, reason)
            raise InvalidTransitionError(run_id, source.value, target.value)
        now = self.clock.now()
        try:
            with self.engine.begin() as conn:
                return self._compare_and_set(conn, run_id, source, target, actor, reason, forced_by, lease_epoch,
                                             expected_version, records, context, result, also, now)
        except _WrongExitError as wrong:
            self._audit_illegal(run_id, source, target, actor, f"{reason} (close reason is {wrong.reason})")
            raise InvalidTransitionError(run_id, source.value, target.value) from None

    def transition_in(
        self,
        conn: sa.Connection,
        run_id: str,
        source: RunState,
        target: RunState,
        *,
        actor: str,
        reason: str,
        forced_by: str | None = None,
        lease_epoch: int | None = None,
        expected_version: int | None = None,
        records: Sequence[TraceRecordIn] = (),
        context: dict[str, Any] | None = _UNSET,
        result: dict[str, Any] | None = _UNSET,
    ) -> TransitionResult:
        """The compare-and-set of `transition`, inside the caller's transaction: for a state change that must
        commit together with other writes or not at all (a human decision and the move it causes).

        Illegal pairs raise InvalidTransitionError (the caller's transaction then rolls back); TRACING's
        exit is not taken here (closing is the state machine's). A lost race is audited in the caller's
        transaction and reported in the result.
        """
        source, target = RunState(source), RunState(target)
        if not is_legal(source, target) or source == RunState.TRACING:
            raise InvalidTransitionError(run_id, source.value, target.value)
        return self._compare_and_set(conn, run_id, source, target, actor, reason, forced_by, lease_epoch,
                                     expected_version, records, context, result, None, self.clock.now())

    def lock_run(self, conn: sa.Connection, run_id: str) -> RunState:
        """Lock the Run's row for the rest of the caller's transaction (SQLite: the transaction already
        holds the write lock) and return its state. Writers that also touch a Run's approval requests lock
        the Run first, so they never deadlock on each other."""
        found = self._raw.fetchone(conn, q.RUN_FOR_CAS_LOCKED if self._locks_rows else q.RUN_FOR_CAS,
                                   {"p_run_id": run_id})
        if found is None:
            raise UnknownRunError(run_id)
        return RunState(found[0])

    def _compare_and_set(
        self, conn: sa.Connection, run_id: str, source: RunState, target: RunState, actor: str, reason: str,
        forced_by: str | None, lease_epoch: int | None, expected_version: int | None,
        records: Sequence[TraceRecordIn], context: dict[str, Any] | None, result: dict[str, Any] | None,
        also: Callable[[sa.Connection], object] | None, now: float,
    ) -> TransitionResult:
        found = self._raw.fetchone(conn, q.RUN_FOR_CAS_LOCKED if self._locks_rows else q.RUN_FOR_CAS,
                                   {"p_run_id": run_id})
        if found is None:
            raise UnknownRunError(run_id)
        row = _CasRow(*found)
        actual = RunState(row.state)
        fenced = lease_epoch is not None and row.lease_epoch != lease_epoch
        stale = expected_version is not None and row.version != expected_version
        if actual != source or fenced or stale:
            self._audit(conn, run_id, LOST_RACE, actor, now, {
                "attempted_from": source.value, "attempted_to": target.value, "actual": actual.value,
                "reason": reason, "fenced": fenced, "stale": stale, "forced_by": forced_by,
            })
            return TransitionResult(run_id, source, target, False, actual, fenced=fenced)
        prior = CloseReason(row.close_reason) if row.close_reason else None
        if source == RunState.TRACING and target != RunState.FAILED and (
                prior is None or target != final_state_for(prior)):
            raise _WrongExitError(prior)  # K3: TRACING's exit follows the close reason, never the caller
        new_reason = close_reason_on_entry(source, target, prior)
        seq = row.version + 1
        values: dict[str, Any] = {
            "p_run_id": run_id,
            "p_state": source.value,
            "p_version": row.version,
            "state": target.value,
            "close_reason": new_reason.value if new_reason else None,
            "version": seq,
            "last_state_change_at": now,
        }
        if context is not _UNSET:
            values["context"] = canonical_json(context) if context is not None else None
        if result is not _UNSET:
            values["result"] = canonical_json(result) if result is not None else None
        cas = q.run_cas_update(context is not _UNSET, result is not _UNSET)
        updated = self._raw.execute(conn, cas, values)
        if updated.rowcount != 1:
            self._audit(conn, run_id, LOST_RACE, actor, now, {
                "attempted_from": source.value, "attempted_to": target.value, "actual": "changed concurrently",
                "reason": reason, "fenced": False, "forced_by": forced_by,
            })
            return TransitionResult(run_id, source, target, False, actual)
        self._write_change(conn, run_id, seq, source, target, actor, reason, forced_by, now, records)
        if also is not None:
            also(conn)
        return TransitionResult(run_id, source, target, True, target, seq=seq, close_reason=new_reason)

    def _write_change(
        self,
        conn: sa.Connection,
        run_id: str,
        seq: int,
        source: RunState | None,
        target: RunState,
        actor: str,
        reason: str,
        forced_by: str | None,
        now: float,
        records: Sequence[TraceRecordIn],
        extra_audit: dict[str, Any] | None = None,
    ) -> None:
        """Everything a state change writes besides runs.state, in the caller's transaction."""
        self._raw.execute(conn, q.TRANSITION_INSERT, {
            "run_id": run_id, "seq": seq, "from_state": source.value if source else None, "to_state": target.value,
            "actor": actor, "reason": reason, "forced_by": forced_by, "at": now,
        })
        projection = {"status": job_status(target).value, "run_state_snapshot": target.value, "updated_at": now}
        if source is None:
            self._raw.execute(conn, q.JOB_INSERT, {"job_id": run_id, **projection})
        else:
            self._raw.execute(conn, q.JOB_UPDATE, {"p_job_id": run_id, **projection})
        outbox = [TraceRecordIn("transition", {
            "run_id": run_id, "seq": seq, "from": source.value if source else None, "to": target.value,
            "actor": actor, "reason": reason, "forced_by": forced_by, "at": now,
        }, run_id)]
        for event in audit_events_for(source, target):
            detail = {"from": source.value if source else None, "to": target.value, "reason": reason,
                      "forced_by": forced_by, **(extra_audit or {})}
            outbox.append(self._audit_row(conn, run_id, event, actor, now, detail))
        outbox.extend(records)
        if any(r.kind == RUN_TRACE and r.run_id == run_id for r in records):
            outbox = self._with_record_commitment(conn, run_id, outbox)
        self.enqueue(conn, outbox, now)

    def _with_record_commitment(self, conn: sa.Connection, run_id: str,
                                outbox: list[TraceRecordIn]) -> list[TraceRecordIn]:
        """The closing transaction's records, the RunTrace naming every other record of the Run: those
        already chained or waiting in the outbox (read under the Run's row lock, so no transition of it
        is missed) and those of this transaction (audit.commitment)."""
        named = [dataclasses.replace(r, record_id=r.record_id or ordered_id()) for r in outbox]
        others = [(str(i), str(k)) for i, k in self._raw.fetchall(conn, q.RECORDS_OF_RUN, {"p_run_id": run_id})]
        others += [(str(r.record_id), r.kind) for r in named if not (r.kind == RUN_TRACE and r.run_id == run_id)]
        committed = commitment.encode(others)
        return [dataclasses.replace(r, payload={**r.payload, commitment.RECORDS_KEY: committed})
                if r.kind == RUN_TRACE and r.run_id == run_id else r for r in named]

    def _audit_row(
        self, conn: sa.Connection, run_id: str | None, event: str, actor: str, now: float, detail: dict[str, Any]
    ) -> TraceRecordIn:
        event_id = ordered_id()
        self._raw.execute(conn, q.AUDIT_INSERT, {"event_id": event_id, "run_id": run_id, "event": event,
                                                 "actor": actor, "detail": canonical_json(detail), "at": now})
        return TraceRecordIn("audit", {"event_id": event_id, "event": event, "actor": actor, "detail": detail,
                                       "at": now}, run_id)

    def _audit(
        self, conn: sa.Connection, run_id: str | None, event: str, actor: str, now: float, detail: dict[str, Any]
    ) -> None:
        self.enqueue(conn, [self._audit_row(conn, run_id, event, actor, now, detail)], now)

    def _audit_illegal(self, run_id: str, source: RunState, target: RunState, actor: str, reason: str) -> None:
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(t.runs.c.run_id).where(t.runs.c.run_id == run_id)).first()
            self._audit(conn, run_id if exists else None, ILLEGAL_TRANSITION, actor, self.clock.now(), {
                "attempted_from": source.value, "attempted_to": target.value, "reason": reason,
                "run_id": run_id, "known_run": exists is not None,
            })

    def write_audit(self, conn: sa.Connection, run_id: str | None, event: str, actor: str,
                    detail: dict[str, Any]) -> None:
        """Append one AuditLog event (and its trace record) inside the caller's transaction."""
        self._audit(conn, run_id, event, actor, self.clock.now(), detail)

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Append one AuditLog event (and its trace record) in its own transaction."""
        with self.engine.begin() as conn:
            self._audit(conn, run_id, event, actor, self.clock.now(), detail)

    # ------------------------------------------------------------------ the trace: outbox and chain

    def enqueue(self, conn: sa.Connection, records: Iterable[TraceRecordIn], now: float) -> None:
        """Write trace records to the outbox inside the caller's transaction.

        A payload's run_id equal to the record's is left out of the payload: the record's run_id column
        holds it, and the chain hashes that column, so it is as tamper-evident there and stored once.
        """
        rows = [
            {"record_id": r.record_id or ordered_id(), "run_id": r.run_id, "kind": r.kind,
             "payload": canonical_json(_without_run_id(r.payload, r.run_id)), "created_at": now}
            for r in records
        ]
        if rows:
            self._raw.executemany(conn, q.OUTBOX_INSERT, rows)

    def record(self, records: Sequence[TraceRecordIn]) -> None:
        """Append trace records through the outbox, in their own transaction."""
        with self.engine.begin() as conn:
            self.enqueue(conn, records, self.clock.now())

    def chain_batch(self, conn: sa.Connection, records: Sequence[PendingRecord],
                    head: tuple[int, str] | None = None) -> int:
        """Append records to the hash chain inside the caller's transaction; returns how many were chained.

        Idempotent: a record already in the chain, or repeated in the batch (re-delivery), is skipped.
        Chainers exclude each other through the chain head (row lock, or SQLite's write lock), and a
        trigger refuses any record whose prev_hash is not the hash of the record at seq - 1 (migration
        0007), so concurrent chainers can never fork the chain.
        """
        seq, prev = head or self._raw.fetchone(conn, q.HEAD_LOCKED if self._locks_rows else q.HEAD)
        if not records:
            return 0
        seen = self._already_chained(conn, records)
        rows = []
        for r in records:
            if r.record_id in seen:
                continue
            seen.add(r.record_id)
            seq += 1
            digest = record_hash(seq, r.record_id, r.run_id, r.kind, prev, r.payload)
            rows.append({"seq": seq, "record_id": r.record_id, "run_id": r.run_id, "kind": r.kind,
                         "payload": r.payload, "prev_hash": prev, "hash": digest})
            prev = digest
        if rows:
            self._raw.executemany(conn, q.TRACE_INSERT, rows)
            self._raw.execute(conn, q.HEAD_UPDATE, {"seq": seq, "hash": prev})
        return len(rows)

    def _already_chained(self, conn: sa.Connection, records: Sequence[PendingRecord]) -> set[str]:
        """Which of these records the chain already holds (a re-delivery)."""
        if self._batches_by_array:  # one round trip for the batch, not one per record
            return {r[0] for r in self._raw.fetchall(conn, q.CHAINED_IDS_ANY,
                                                     {"p_ids": [r.record_id for r in records]})}
        # in process (SQLite) one probe of the record_id index per record is cheaper than an IN list
        return {r.record_id for r in records
                if self._raw.fetchone(conn, q.CHAINED_ID, {"p_id": r.record_id}) is not None}

    def _drain_once(self, batch_size: int) -> tuple[int, int]:
        """Move up to `batch_size` outbox records into the hash chain; returns (chained, taken).

        A record already in the chain (re-delivery) is dropped from the outbox, not chained twice.
        The chain head is locked before the batch is read, so concurrent drainers take turns rather
        than reading the same rows.
        """
        with self.engine.begin() as conn:
            return self._drain_batch(conn, batch_size)

    def _drain_batch(self, conn: sa.Connection, batch_size: int) -> tuple[int, int]:
        head = self._raw.fetchone(conn, q.HEAD_LOCKED if self._locks_rows else q.HEAD)
        pending = [_OutboxRow(*r) for r in
                   self._raw.fetchall(conn, q.OUTBOX_BATCH, {"p_limit": batch_size})]
        if not pending:
            return 0, 0
        # the head just read (and, on a server, locked) is the one the batch chains onto
        chained = self.chain_batch(conn, [PendingRecord(p.record_id, p.run_id, p.kind, p.payload)
                                          for p in pending], head=(int(head[0]), str(head[1])))
        if self._batches_by_array:
            self._raw.execute(conn, q.OUTBOX_DELETE_ANY, {"p_ids": [p.id for p in pending]}).close()
        else:
            self._raw.executemany(conn, q.OUTBOX_DELETE_ONE, [{"p_id": p.id} for p in pending])
        return chained, len(pending)

    def drain_within(self, conn: sa.Connection, batch_size: int = 500) -> int:
        """Drain the outbox inside the caller's transaction (a Run's closing one: one commit fewer per
        Run), under a savepoint: a drain that fails rolls back alone, the caller's writes commit, and the
        records wait in the outbox for the next drain (A4: a failing trace store never blocks a Run).
        With a trace buffer the records go through the buffer instead, outside any transaction."""
        if self.trace_buffer is not None:
            return 0
        total = 0
        try:
            with self._raw.savepoint(conn, "harness_drain"):
                while True:
                    chained, processed = self._drain_batch(conn, batch_size)
                    total += chained
                    if processed < batch_size:
                        return total
        except sa.exc.SQLAlchemyError as exc:
            _log.warning("drain inside the closing transaction failed; the records stay in the outbox: %s", exc)
            return 0

    def pending_records(self, limit: int) -> list[PendingRecord]:
        """The oldest `limit` records waiting in the outbox, oldest first (what a trace buffer relays)."""
        with self.reader.connect() as conn:
            rows = conn.execute(q.OUTBOX_BATCH, {"p_limit": limit}).all()
        return [PendingRecord(r.record_id, r.run_id, r.kind, r.payload) for r in rows]

    def chain_records(self, records: Sequence[PendingRecord]) -> int:
        """Chain records that came through a trace buffer and drop their outbox rows, in one transaction;
        returns how many were chained (a re-delivered record is skipped)."""
        with self.engine.begin() as conn:
            chained = self.chain_batch(conn, records)
            if records:
                conn.execute(q.OUTBOX_DELETE_RECORDS, {"p_ids": [r.record_id for r in records]})
        return chained

    def drain(self, batch_size: int = 500) -> int:
        """Chain one batch of outbox records (through the trace buffer, if any); returns how many."""
        if self.trace_buffer is not None:
            return self.trace_buffer.drain(self, batch_size)
        return self._drain_once(batch_size)[0]

    def drain_all(self, batch_size: int = 500) -> int:
        """Drain until the outbox is empty (or, with a trace buffer, until nothing moves); returns how
        many records were chained."""
        if self.trace_buffer is not None:
            return self.trace_buffer.drain_all(self, batch_size)
        total = 0
        while True:
            chained, processed = self._drain_once(batch_size)
            total += chained
            if processed < batch_size:
                return total

    def probe_write(self, by: str = "health", timeout_s: float = 2.0) -> None:
        """Prove the database takes writes now: commit an update of the health heartbeat row. Raises the
        database's error when it refuses; waits at most about `timeout_s` for a lock (SQLite's busy
        timeout, PostgreSQL's statement timeout) instead of a writer's usual minute."""
        with self.engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            driver = conn.connection.driver_connection
            if sqlite:
                driver.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")  # type: ignore[union-attr]
            try:
                with conn.begin():
                    if conn.dialect.name == "postgresql":
                        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(timeout_s * 1000)}")
                    beat = {"at": self.clock.now(), "prober": by[:128]}
                    updated = conn.execute(t.health_heartbeat.update().where(t.health_heartbeat.c.id == 1), beat)
                    if updated.rowcount == 0:
                        conn.execute(t.health_heartbeat.insert().values(id=1, **beat))
            finally:
                if sqlite:
                    driver.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # type: ignore[union-attr]

    def outbox_backlog(self) -> int:
        """How many records wait in the outbox to be chained."""
        with self.reader.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t.outbox)).scalar_one())

    def chain_head(self) -> tuple[int, str]:
        """(seq, hash) of the newest chained record, as the chain head table says."""
        with self.reader.connect() as conn:
            row = conn.execute(sa.select(t.chain_head.c.seq, t.chain_head.c.hash).where(t.chain_head.c.id == 1)).one()
        return int(row.seq), str(row.hash)

    def iter_trace(self, start_seq: int = 1, batch: int = 5000) -> Iterator[StoredTraceRecord]:
        """Every chained record from `start_seq`, in chain order, streamed in batches."""
        after = start_seq - 1
        while True:
            with self.reader.connect() as conn:  # on the cursor: a verify reads every record of the chain
                rows = self._raw.fetchall(conn, q.TRACE_AFTER, {"p_after": after, "p_limit": batch})
            if not rows:
                return
            for r in rows:
                yield StoredTraceRecord(*r)
            after = rows[-1][0]

    def trace_of(self, run_id: str) -> list[StoredTraceRecord]:
        """A Run's chained records, in chain order."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                sa.select(t.trace_records).where(t.trace_records.c.run_id == run_id).order_by(t.trace_records.c.seq)
            ).all()
        return [StoredTraceRecord(r.seq, r.record_id, r.run_id, r.kind, r.payload, r.prev_hash, r.hash) for r in rows]

    # ------------------------------------------------------------------ reads

    def get_run(self, run_id: str) -> RunRecord:
        """The Run with this id; UnknownRunError when there is none."""
        with self.reader.connect() as conn:
            rows = self._raw.mappings(conn, q.RUN_BY_ID, {"p_run_id": run_id})
        if not rows:
            raise UnknownRunError(run_id)
        return _run_of(rows[0])

    def state_of(self, run_id: str) -> RunState:
        """Only the Run's state: the cheap check made between steps (cancelled? swept?)."""
        with self.reader.connect() as conn:
            found = self._raw.fetchone(conn, q.STATE_OF, {"p_run_id": run_id})
        if found is None:
            raise UnknownRunError(run_id)
        return RunState(found[0])

    def final_among(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these Runs are in a final state (ids of no Run are not)."""
        if not run_ids:
            return set()
        final = [s.value for s in FINAL]
        query = sa.select(t.runs.c.run_id).where(t.runs.c.run_id.in_(list(run_ids)), t.runs.c.state.in_(final))
        with self.reader.connect() as conn:
            return set(conn.execute(query).scalars())

    def list_runs(self, *, tenant_id: str | None = None, limit: int = 50) -> list[RunRecord]:
        """The newest Runs first."""
        query = sa.select(*q.RUN_RECORD).order_by(t.runs.c.created_at.desc()).limit(limit)
        if tenant_id is not None:
            query = query.where(t.runs.c.tenant_id == tenant_id)
        with self.reader.connect() as conn:
            return [_run_from_row(r) for r in conn.execute(query)]

    def unowned_runs(self, grace_s: float, limit: int = 1000) -> list[str]:
        """Runs a driver should be driving and nobody is: in a state that moves on by itself (not final,
        not waiting for a human), with no live lease, unchanged for `grace_s` — their driver died or
        never started. Oldest first."""
        now = self.clock.now()
        active = [s.value for s in RunState if s not in FINAL and s != RunState.AWAITING_HITL]
        query = (
            sa.select(t.runs.c.run_id)
            .where(t.runs.c.state.in_(active), t.runs.c.last_state_change_at <= now - grace_s,
                   sa.or_(t.runs.c.lease_expires_at.is_(None), t.runs.c.lease_expires_at < now))
            .order_by(t.runs.c.last_state_change_at)
            .limit(limit)
        )
        with self.reader.connect() as conn:
            return list(conn.execute(query).scalars())

    def transitions_of(self, run_id: str) -> list[TransitionRow]:
        """A Run's state changes in order, CREATED first."""
        with self.reader.connect() as conn:
            rows = self._raw.mappings(conn, q.TRANSITIONS_OF, {"p_run_id": run_id})
        return [_transition_of(r) for r in rows]

    def run_with_transitions(self, run_id: str) -> tuple[RunRecord, list[TransitionRow]]:
        """A Run and its state changes from one snapshot, in one round trip (what closing a Run needs)."""
        with self.reader.connect() as conn, conn.begin():  # raw cursors do not autobegin: begin here
            found = self._raw.mappings(conn, q.RUN_BY_ID, {"p_run_id": run_id})
            if not found:
                raise UnknownRunError(run_id)
            rows = self._raw.mappings(conn, q.TRANSITIONS_OF, {"p_run_id": run_id})
        return _run_of(found[0]), [_transition_of(r) for r in rows]

    def outcome_of(self, run_id: str) -> tuple[RunState, dict[str, Any] | None, list[RunState]]:
        """(state, result, path) of a Run from one snapshot: what its caller is answered, without the
        request and RunContext a full read decodes."""
        with self.reader.connect() as conn, conn.begin():
            found = self._raw.fetchone(conn, q.OUTCOME_OF, {"p_run_id": run_id})
            if found is None:
                raise UnknownRunError(run_id)
            path = [RunState(r[0]) for r in self._raw.fetchall(conn, q.PATH_OF, {"p_run_id": run_id})]
        return RunState(found[0]), json.loads(found[1]) if found[1] else None, path

    def audit_events(self, *, run_id: str | None = None, event: str | None = None) -> list[AuditEvent]:
        """AuditLog events, oldest first, optionally for one Run or one event name."""
        query = sa.select(t.audit_events).order_by(t.audit_events.c.id)
        if run_id is not None:
            query = query.where(t.audit_events.c.run_id == run_id)
        if event is not None:
            query = query.where(t.audit_events.c.event == event)
        with self.reader.connect() as conn:
            return [AuditEvent(r.event_id, r.run_id, r.event, r.actor, json.loads(r.detail), r.at)
                    for r in conn.execute(query)]

    def legacy_job(self, run_id: str) -> tuple[str, str]:
        """(status, run_state_snapshot) of the legacy job row; for legacy consumers and checks only."""
        with self.reader.connect() as conn:
            row = conn.execute(
                sa.select(t.jobs.c.status, t.jobs.c.run_state_snapshot).where(t.jobs.c.job_id == run_id)
            ).first()
        if row is None:
            raise UnknownRunError(run_id)
        return str(row.status), str(row.run_state_snapshot)

    def save_context(self, run_id: str, context: dict[str, Any], records: Sequence[TraceRecordIn] = (),
                     also: Callable[[sa.Connection], object] | None = None) -> None:
        """Persist the RunContext (never Run.state) with trace records, in one transaction — e.g. a
        step's result and its ToolTrace before the next step starts (SPEC T6). `also` runs in the same
        transaction, for writes that must commit with it (the contents the records reference)."""
        with self.engine.begin() as conn:
            if also is not None:
                also(conn)
            self._raw.execute(conn, q.CONTEXT_UPDATE, {"p_run_id": run_id, "context": canonical_json(context)})
            self.enqueue(conn, records, self.clock.now())

    def mark_step_started(self, run_id: str, step_id: str, context: dict[str, Any], *,
                          lease_epoch: int | None) -> str | None:
        """Write the RunContext with a non-idempotent step marked started, if and only if, at this moment,
        the Run is EXECUTING, under `lease_epoch` when given, and its stored RunContext has no entry for
        the step yet (T6, K5b). Returns None when marked, "superseded" when the Run left EXECUTING or its
        lease moved on, or the status the stored entry already has (another drive reached the step)."""
        with self.engine.begin() as conn:
            found = self._raw.fetchone(conn, q.RUN_FOR_STEP_LOCKED if self._locks_rows else q.RUN_FOR_STEP,
                                       {"p_run_id": run_id})
            if found is None:
                raise UnknownRunError(run_id)
            state, epoch, stored = found
            if state != RunState.EXECUTING.value or (lease_epoch is not None and epoch != lease_epoch):
                return "superseded"
            entry = (json.loads(stored) if stored else {}).get("steps", {}).get(step_id)
            if entry is not None:
                return str(entry.get("status") or "started")
            self._raw.execute(conn, q.CONTEXT_UPDATE, {"p_run_id": run_id, "context": canonical_json(context)})
        return None

    def database_id(self) -> str:
        """The id written when the database was created (migration 0013): what checkpoints name."""
        if self._database_id is None:
            with self.reader.connect() as conn:
                found = conn.execute(sa.select(t.database_identity.c.database_id)
                                     .where(t.database_identity.c.id == 1)).scalar()
            if found is None:
                raise StoreError("database_identity has no row: the database was damaged")
            self._database_id = str(found)
        return self._database_id

    def raise_if_corrupt(self) -> None:
        """Raise StoreError when the chain head table is missing its row (a damaged database)."""
        with self.reader.connect() as conn:
            if conn.execute(sa.select(t.chain_head.c.id)).first() is None:
                raise StoreError("chain_head row is missing: the database was damaged")
