"""Statements built once, executed with parameters: the hot path never rebuilds SQL (issue 9 profile).

Building `update().where().values()` on every call cost more than executing it; these are compiled
once per dialect and cached by SQLAlchemy.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t

b = sa.bindparam

#: the columns a RunRecord is made of: every column but the idempotency body hash, which only the key
#: lookup reads (and which a database before migration 0011 does not have)
#: a Run as RunRecord reads it: not the columns later migrations added that it does not carry (the older
#: migrations' tests read Runs at their revision)
RUN_RECORD = [c for c in t.runs.c if c.name not in ("request_hash", "start_by", "lease_waiting")]
RUN_BY_ID = sa.select(*RUN_RECORD).where(t.runs.c.run_id == b("p_run_id"))
STATE_OF = sa.select(t.runs.c.state).where(t.runs.c.run_id == b("p_run_id"))
OUTCOME_OF = sa.select(t.runs.c.state, t.runs.c.result).where(t.runs.c.run_id == b("p_run_id"))
PATH_OF = sa.select(t.transitions.c.to_state).where(t.transitions.c.run_id == b("p_run_id")).order_by(
    t.transitions.c.seq)
RUN_FOR_CAS = sa.select(t.runs.c.state, t.runs.c.close_reason, t.runs.c.version, t.runs.c.lease_epoch).where(
    t.runs.c.run_id == b("p_run_id")
)
RUN_FOR_CAS_LOCKED = RUN_FOR_CAS.with_for_update()
RUN_FOR_STEP = sa.select(t.runs.c.state, t.runs.c.lease_epoch, t.runs.c.context).where(
    t.runs.c.run_id == b("p_run_id")
)
RUN_FOR_STEP_LOCKED = RUN_FOR_STEP.with_for_update()
RUN_INSERT = t.runs.insert()
TRANSITION_INSERT = t.transitions.insert()
TRANSITIONS_OF = sa.select(t.transitions).where(t.transitions.c.run_id == b("p_run_id")).order_by(t.transitions.c.seq)
JOB_INSERT = t.jobs.insert()
JOB_UPDATE = (
    t.jobs.update()
    .where(t.jobs.c.job_id == b("p_job_id"))
    .values(status=b("status"), run_state_snapshot=b("run_state_snapshot"), updated_at=b("updated_at"))
)
AUDIT_INSERT = t.audit_events.insert()
OUTBOX_INSERT = t.outbox.insert()
CONTEXT_UPDATE = t.runs.update().where(t.runs.c.run_id == b("p_run_id")).values(context=b("context"))
#: the RunContext written by the drive holding the lease at p_epoch, and by nobody after a takeover
CONTEXT_UPDATE_FENCED = t.runs.update().where(
    t.runs.c.run_id == b("p_run_id"), t.runs.c.lease_epoch == b("p_epoch")).values(context=b("context"))
HEAD = sa.select(t.chain_head.c.seq, t.chain_head.c.hash).where(t.chain_head.c.id == 1)
HEAD_LOCKED = HEAD.with_for_update()
#: the head locked, or no row when another transaction holds it (a drainer that would rather not wait)
HEAD_LOCKED_UNLESS_BUSY = HEAD.with_for_update(skip_locked=True)
HEAD_UPDATE = t.chain_head.update().where(t.chain_head.c.id == 1).values(seq=b("seq"), hash=b("hash"))
OUTBOX_BATCH = (
    sa.select(t.outbox.c.id, t.outbox.c.record_id, t.outbox.c.run_id, t.outbox.c.kind, t.outbox.c.payload)
    .order_by(t.outbox.c.id)
    .limit(b("p_limit"))
)
#: the batch, each record with its seq when the chain holds it already (a re-delivery). The seq is a scalar
#: subquery, one probe of the record_id index per record of the batch: as a join, PostgreSQL hashed the
#: whole trace_records table once the outbox held a few hundred rows (10.7 against 1.0 ms with 300
#: pending and 20,000 chained), a drain that grew with the chain
OUTBOX_BATCH_CHAINED = (
    sa.select(t.outbox.c.id, t.outbox.c.record_id, t.outbox.c.run_id, t.outbox.c.kind, t.outbox.c.payload,
              sa.select(t.trace_records.c.seq).where(t.trace_records.c.record_id == t.outbox.c.record_id)
              .correlate(t.outbox).scalar_subquery())
    .order_by(t.outbox.c.id)
    .limit(b("p_limit"))
)
OUTBOX_ANY = sa.select(t.outbox.c.id).limit(1)
TRACE_INSERT = t.trace_records.insert()
#: the chain from a position on, in the column order of StoredTraceRecord
TRACE_AFTER = (
    sa.select(t.trace_records.c.seq, t.trace_records.c.record_id, t.trace_records.c.run_id, t.trace_records.c.kind,
              t.trace_records.c.payload, t.trace_records.c.prev_hash, t.trace_records.c.hash)
    .where(t.trace_records.c.seq > b("p_after")).order_by(t.trace_records.c.seq).limit(b("p_limit"))
)
CHAINED_ID = sa.select(t.trace_records.c.record_id).where(t.trace_records.c.record_id == b("p_id"))
#: every record of a Run, chained or waiting in the outbox (what its RunTrace commits to)
RECORDS_OF_RUN = sa.union_all(
    sa.select(t.trace_records.c.record_id, t.trace_records.c.kind).where(t.trace_records.c.run_id == b("p_run_id")),
    sa.select(t.outbox.c.record_id, t.outbox.c.kind).where(t.outbox.c.run_id == b("p_run_id")),
)
OUTBOX_DELETE_ONE = t.outbox.delete().where(t.outbox.c.id == b("p_id"))
#: SQLite: a batch is every row from its first id to its last (read under the one writer's lock, in id order)
OUTBOX_DELETE_RANGE = t.outbox.delete().where(t.outbox.c.id.between(b("p_first"), b("p_last")))


# PostgreSQL: a whole batch in one statement (an array parameter), where each row would be a round trip.
# Built at first use, once: SQLAlchemy's postgresql package (all its drivers' modules) costs a SQLite
# process's start ~20 ms.
@cache
def chained_ids_any() -> sa.Select[tuple[str]]:
    """The record ids among :p_ids (an array) the chain holds."""
    from sqlalchemy.dialects import postgresql as pg

    return sa.select(t.trace_records.c.record_id).where(
        t.trace_records.c.record_id == sa.any_(b("p_ids", type_=pg.ARRAY(sa.String))))


@cache
def outbox_delete_any() -> sa.Delete:
    """Delete the outbox rows whose ids are in :p_ids (an array)."""
    from sqlalchemy.dialects import postgresql as pg

    return t.outbox.delete().where(t.outbox.c.id == sa.any_(b("p_ids", type_=pg.ARRAY(sa.Integer))))


OUTBOX_DELETE_RECORDS = t.outbox.delete().where(t.outbox.c.record_id.in_(b("p_ids", expanding=True)))


@cache
def run_cas_returning(with_context: bool, with_result: bool, sets_reason: bool, fenced: bool,
                      versioned: bool, exits: int = 0) -> sa.Update:
    """The compare-and-set in one statement: UPDATE runs … WHERE run_id and state match (and the lease
    epoch, and the version, when the caller holds them; and for TRACING's exit, the close reason is one
    of the `exits` given as p_reason_0…) … RETURNING the new version and close reason. The version is
    incremented by the statement; the close reason is set only by the moves that set it."""
    values: dict[str, Any] = {
        "state": b("state"),
        "version": t.runs.c.version + 1,
        "last_state_change_at": b("last_state_change_at"),
    }
    if sets_reason:
        values["close_reason"] = b("close_reason")
    if with_context:
        values["context"] = b("context")
    if with_result:
        values["result"] = b("result")
    where = [t.runs.c.run_id == b("p_run_id"), t.runs.c.state == b("p_state")]
    if fenced:
        where.append(t.runs.c.lease_epoch == b("p_epoch"))
    if versioned:
        where.append(t.runs.c.version == b("p_version"))
    if exits:
        where.append(sa.or_(*(t.runs.c.close_reason == b(f"p_reason_{n}") for n in range(exits))))
    return t.runs.update().where(*where).values(**values).returning(t.runs.c.version, t.runs.c.close_reason)


@cache
def run_cas_update(with_context: bool, with_result: bool) -> sa.Update:
    """UPDATE runs … WHERE run_id, state and version match: the compare-and-set of SPEC K4."""
    values: dict[str, sa.BindParameter[Any]] = {
        "state": b("state"),
        "close_reason": b("close_reason"),
        "version": b("version"),
        "last_state_change_at": b("last_state_change_at"),
    }
    if with_context:
        values["context"] = b("context")
    if with_result:
        values["result"] = b("result")
    return (
        t.runs.update()
        .where(
            t.runs.c.run_id == b("p_run_id"),
            t.runs.c.state == b("p_state"),
            t.runs.c.version == b("p_version"),
        )
        .values(**values)
    )
