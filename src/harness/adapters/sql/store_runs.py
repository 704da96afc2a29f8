"""The SQL store's writes of Runs: creation, the one transition path (SPEC K4), context and steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q
from harness.adapters.sql.database import connection_of, read_retried
from harness.adapters.sql.documents import encode_context, unpack
from harness.adapters.sql.pg_listen import NOTIFY
from harness.adapters.sql.run_rows import created_record, documents, new_run_row, transition_row
from harness.adapters.sql.store_base import (
    CasRow,
    WrongExitError,
    run_of,
)
from harness.adapters.sql.store_chain import TraceChain
from harness.audit import commitment
from harness.domain.chain import canonical_json
from harness.domain.errors import IdempotencyConflictError, InvalidTransitionError, UnknownRunError
from harness.domain.ids import ordered_id
from harness.domain.records import (
    RUN_TRACE,
    UNSET,
    NewRun,
    RunRecord,
    TraceRecordIn,
    TransitionResult,
)
from harness.kernel.events import ILLEGAL_TRANSITION, LOST_RACE, audit_events_for
from harness.kernel.projection import job_status
from harness.kernel.states import CloseReason, RunState
from harness.kernel.transitions import (
    close_reason_on_entry,
    exit_reasons,
    final_state_for,
    is_legal,
    keeps_close_reason,
)
from harness.ports import Tx


class RunWrites(TraceChain):
    """Runs created, moved (compare-and-set, with its audit, projection and outbox rows) and saved."""

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
                # without an idempotency key nothing can conflict (the id is new): the row goes with the
                # transaction's next statement (one round trip fewer on PostgreSQL); a key's conflict must
                # be seen here
                (self._raw.execute if new.idempotency_key is not None else self._raw.later)(
                    conn,
                    q.RUN_INSERT,
                    new_run_row(new, now, request),
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
        # accepted: durable before the caller gets its id, even inside another Run's drive; in a unit of its
        # own (RunManager.create_run, whose caller gets the id with the result) it commits with the drive's
        # first writes instead
        unit = self.units.current()
        if unit is None or unit.key != new.run_id:
            self.units.boundary()
        # the row just committed, without reading it back: one transaction fewer per Run
        return created_record(new, now, request), True

    def find_by_idempotency_key(self, tenant_id: str, user_id: str, key: str) -> RunRecord | None:
        """The Run this user of the tenant created with this idempotency key, if any."""
        found = self._by_key(tenant_id, user_id, key)
        return found[0] if found else None

    def _by_key(self, tenant_id: str, user_id: str, key: str) -> tuple[RunRecord, str | None] | None:
        query = sa.select(*q.RUN_RECORD, t.runs.c.request_hash).where(
            t.runs.c.tenant_id == tenant_id, t.runs.c.user_id == user_id, t.runs.c.idempotency_key == key)
        row = read_retried(self.reader, lambda conn: conn.execute(query).first())
        return (run_of(row._mapping), row._mapping["request_hash"]) if row else None

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
        context: dict[str, Any] | None = UNSET,
        result: dict[str, Any] | None = UNSET,
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
        except WrongExitError as wrong:
            self._audit_illegal(run_id, source, target, actor, f"{reason} (close reason is {wrong.reason})")
            raise InvalidTransitionError(run_id, source.value, target.value) from None

    def transition_in(
        self,
        tx: Tx,
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
        context: dict[str, Any] | None = UNSET,
        result: dict[str, Any] | None = UNSET,
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
        return self._compare_and_set(connection_of(tx), run_id, source, target, actor, reason, forced_by, lease_epoch,
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
        if self._cas_returns:
            moved = self._cas_in_one(conn, run_id, source, target, lease_epoch, expected_version, context, result,
                                     now)
            if moved is not None:
                seq, reason_now = moved
                self._write_change(conn, run_id, seq, source, target, actor, reason, forced_by, now, records)
                if also is not None:
                    also(conn)
                return TransitionResult(run_id, source, target, True, target, seq=seq, close_reason=reason_now)
            # not applied: the read below says why (a lost race, a fence, an unknown Run) and audits it
        found = self._raw.fetchone(conn, q.RUN_FOR_CAS_LOCKED if self._locks_rows else q.RUN_FOR_CAS,
                                   {"p_run_id": run_id})
        if found is None:
            raise UnknownRunError(run_id)
        row = CasRow(*found)
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
            raise WrongExitError(prior)  # K3: TRACING's exit follows the close reason, never the caller
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
            **documents(context, result, packs=self._packs_context),
        }
        cas = q.run_cas_update(context is not UNSET, result is not UNSET)
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

    def _cas_in_one(self, conn: sa.Connection, run_id: str, source: RunState, target: RunState,
                    lease_epoch: int | None, expected_version: int | None, context: dict[str, Any] | None,
                    result: dict[str, Any] | None, now: float) -> tuple[int, CloseReason | None] | None:
        """The compare-and-set as one `UPDATE … WHERE state, lease epoch and version match … RETURNING`
        (PostgreSQL, SQLite): the new version and close reason when it applied, None when it did not.
        The row lock the UPDATE takes holds to the commit, as the `SELECT … FOR UPDATE` did. TRACING's exit
        to a final state applies only under a close reason that leads there (K3): the statement matches it;
        any other (a wrong exit) is found and refused by the read that follows a miss."""
        closing = source == RunState.TRACING and target != RunState.FAILED
        keeps = closing or keeps_close_reason(source, target)
        exits = exit_reasons(target) if closing else ()
        values: dict[str, Any] = {"p_run_id": run_id, "p_state": source.value, "state": target.value,
                                  "last_state_change_at": now}
        for n, reason in enumerate(exits):
            values[f"p_reason_{n}"] = reason.value
        if not keeps:
            values["close_reason"] = getattr(close_reason_on_entry(source, target, None), "value", None)
        if lease_epoch is not None:
            values["p_epoch"] = lease_epoch
        if expected_version is not None:
            values["p_version"] = expected_version
        values.update(documents(context, result, packs=self._packs_context))
        cas = q.run_cas_returning(context is not UNSET, result is not UNSET, not keeps, lease_epoch is not None,
                                  expected_version is not None, len(exits))
        row = self._raw.fetchone(conn, cas, values)
        if row is None:
            return None
        return int(row[0]), CloseReason(row[1]) if row[1] else None

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
        self._raw.later(conn, q.TRANSITION_INSERT,
                        transition_row(run_id, seq, source, target, actor, reason, forced_by, now))
        if self.notify_changes:  # delivered at commit, never for a change rolled back
            self._raw.later(conn, NOTIFY, {"run_id": run_id})
        projection = {"status": job_status(target).value, "run_state_snapshot": target.value, "updated_at": now}
        if source is None:
            self._raw.later(conn, q.JOB_INSERT, {"job_id": run_id, **projection})
        else:
            self._raw.later(conn, q.JOB_UPDATE, {"p_job_id": run_id, **projection})
        # the StepTraces of the steps this transition ends ride in its record (trace format 2); the trace
        # models are imported by the first write, not by a command that only reads (runs show, approvals)
        from harness.domain.traces import STEPS_KEY, fold_steps

        steps, records = fold_steps(run_id, records)
        change = {"run_id": run_id, "seq": seq, "from": source.value if source else None, "to": target.value,
                  "actor": actor, "reason": reason, "forced_by": forced_by, "at": now}
        if steps:
            change[STEPS_KEY] = steps
        outbox = [TraceRecordIn("transition", change, run_id)]
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

    def _audit_illegal(self, run_id: str, source: RunState, target: RunState, actor: str, reason: str) -> None:
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(t.runs.c.run_id).where(t.runs.c.run_id == run_id)).first()
            self._audit(conn, run_id if exists else None, ILLEGAL_TRANSITION, actor, self.clock.now(), {
                "attempted_from": source.value, "attempted_to": target.value, "reason": reason,
                "run_id": run_id, "known_run": exists is not None,
            })

    # ------------------------------------------------------------------ context and steps

    def save_context(self, run_id: str, context: dict[str, Any] | None, records: Sequence[TraceRecordIn] = (),
                     also: Callable[[sa.Connection], object] | None = None, *,
                     lease_epoch: int | None = None) -> bool:
        """Persist the RunContext (never Run.state) with trace records, in one transaction — e.g. a
        step's result and its ToolTrace before the next step starts (SPEC T6). `also` runs in the same
        transaction, for writes that must commit with it (the contents the records reference).

        With `lease_epoch`, only while the Run's lease is still at that epoch (K5b): False, and nothing
        written, when it was taken over. A None context writes the records alone, in a transaction that
        writes the RunContext itself (a started mark, which has checked the lease): no `lease_epoch`."""
        if context is None and lease_epoch is not None:
            raise ValueError("a save without a RunContext has no write to fence: check the lease in its transaction")
        with self.engine.begin() as conn:
            if context is not None:
                values = {"p_run_id": run_id, "context": encode_context(context, packs=self._packs_context)}
                if lease_epoch is None:
                    self._raw.later(conn, q.CONTEXT_UPDATE, values)
                elif self._raw.execute(conn, q.CONTEXT_UPDATE_FENCED,
                                       {**values, "p_epoch": lease_epoch}).rowcount != 1:
                    return False
            if also is not None:
                also(conn)
            self.enqueue(conn, records, self.clock.now())
        return True

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
            entry = (unpack(stored, run_id) or {}).get("steps", {}).get(step_id)
            if entry is not None:
                return str(entry.get("status") or "started")
            self._raw.execute(conn, q.CONTEXT_UPDATE,
                              {"p_run_id": run_id, "context": encode_context(context, packs=self._packs_context)})
        return None
