"""The rows people read, checked against the chained records they mirror (SPEC A1-A3, K8).

`runs show`, the console and the API read rows; only the chain is tamper-evident. For every row that
mirrors a record — transitions, audit events, costs, approval requests and decisions, a Run's state,
close reason, owner, result and path, its legacy job — the payload the row implies
(audit.mirror_records) is compared field by field with the chained record (or the one still waiting in
the outbox), and each difference is named by table, row and field. A Run's RunTrace also names every
other record the Run had when it closed (audit.commitment): one that is gone from the chain is named.

Runs are read in batches of `batch`, each batch in one repeatable-read snapshot (records and rows of a
live database then agree), so memory stays bounded however many Runs there are.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.retention_schema import erased_runs
from harness.adapters.sql.store import SqlStore
from harness.audit import commitment, mirror_records
from harness.domain.audit import ChainReport, Problem
from harness.domain.chain import canonical_json, content_hash
from harness.domain.records import RUN_TRACE
from harness.kernel import FINAL, CloseReason, RunState, close_reason_on_entry, job_status
from harness.kernel.events import RUN_CREATED

_MIRRORED = ("transition", "audit", "cost", RUN_TRACE, mirror_records.HITL_REQUEST, mirror_records.HITL_DECISION)
#: payload keys whose column is named otherwise
_COLUMN = {"transitions": {"from": "from_state", "to": "to_state"}}
_ROW_TABLES = (t.transitions, t.audit_events, t.costs, t.hitl_requests, t.hitl_decisions)
_MISSING = object()
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class _Record:
    """A record of a Run, chained (seq) or waiting in the outbox (seq None); payload only for the kinds
    rows mirror."""

    seq: int | None
    record_id: str
    kind: str
    payload: dict[str, Any]

    @property
    def where(self) -> str:
        return f"record seq {self.seq}" if self.seq is not None else f"record {self.record_id} (in the outbox)"


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value (a double read back is the double written), the rest by
    canonical JSON."""
    if type(a) is type(b) and a == b and type(a) in _SCALARS:  # the common case, without encoding
        return True
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    try:
        return canonical_json(a) == canonical_json(b)
    except ValueError:
        return False


def _parsed(payload: str | None) -> dict[str, Any]:
    try:
        value = json.loads(payload) if payload else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _Checker:
    """Adds one Problem per field that differs; counts the rows it checked."""

    def __init__(self, report: ChainReport) -> None:
        self.report = report
        self.legacy_run_traces = 0
        self._columns: dict[str, list[sa.Column[Any]]] | None = None

    def columns(self, conn: sa.Connection) -> dict[str, list[sa.Column[Any]]]:
        """The columns of the mirrored tables this database has, read once per verify."""
        if self._columns is None:
            self._columns = {table.name: _columns(conn, table) for table in (t.runs, t.jobs, *_ROW_TABLES)}
        return self._columns

    def problem(self, kind: str, table: str, row: str, detail: str, *, run_id: str | None,
                rec: _Record | None = None, field: str | None = None) -> None:
        self.report.add(Problem(kind, rec.seq if rec else None, rec.record_id if rec else None,
                                f"{table} {row}: {detail}", run_id, table, row, field))

    def diff(self, table: str, row: str, expected: Mapping[Any, Any], rec: _Record, run_id: str | None) -> None:
        """One problem per field of `expected` that the record does not hold as the row does."""
        self.report.rows_checked += 1
        for key, value in expected.items():
            got = rec.payload.get(key, _MISSING)
            if got is _MISSING or not _same(value, got):
                column = _COLUMN.get(table, {}).get(key, key)
                said = "nothing" if got is _MISSING else repr(got)
                self.problem("row_mismatch", table, row,
                             f"{column} is {value!r} but its chained {rec.where} says {said}",
                             run_id=run_id, rec=rec, field=column)

    def keyed(self, table: str, rows: Iterable[Mapping[Any, Any]], records: Iterable[_Record], key: str,
              mirror: Callable[[Mapping[Any, Any]], dict[str, Any]], name: Callable[[Mapping[Any, Any]], str],
              run_id: str | None, unchained: str = "row_unchained") -> None:
        """Rows and records matched by a key both carry (seq, event_id, decision_id)."""
        by_key = {r.payload.get(key): r for r in records}
        for row in rows:
            rec = by_key.pop(row[key], None)
            if rec is None:
                self.problem(unchained, table, name(row), "no chained record mirrors this row", run_id=run_id)
            else:
                self.diff(table, name(row), mirror(row), rec, run_id)
        for k, rec in by_key.items():
            self.problem("record_without_row", table, f"{key} {k}",
                         f"the chained {rec.where} has no row (deleted?)", run_id=run_id, rec=rec)

    def costs(self, rows: list[Mapping[Any, Any]], records: list[_Record], run_id: str) -> None:
        """Costs carry no key their CostTrace repeats: matched as a multiset, the rest paired in order."""
        pending = list(records)
        unmatched = []
        for row in rows:
            expected = mirror_records.cost(row)
            rec = next((r for r in pending if all(_same(v, r.payload.get(k)) for k, v in expected.items())), None)
            if rec is None:
                unmatched.append(row)
            else:
                pending.remove(rec)
                self.report.rows_checked += 1
        for row in unmatched:
            same_source = [r for r in pending if r.payload.get("source") == row["source"]]
            candidates = same_source or pending
            if not candidates:
                self.problem("row_unchained", "costs", f"id {row['id']}", "no CostTrace record mirrors this cost",
                             run_id=run_id)
                continue
            rec = candidates[0]
            pending.remove(rec)
            self.diff("costs", f"id {row['id']}", mirror_records.cost(row), rec, run_id)
        for rec in pending:
            self.problem("record_without_row", "costs", f"run {run_id}",
                         f"the chained CostTrace {rec.where} has no costs row (deleted?)", run_id=run_id, rec=rec)

    def requests(self, rows: list[Mapping[Any, Any]], records: list[_Record], run_id: str) -> None:
        """An approval request against the chained record of its last write (its decided status, if any:
        a status moves once, from pending)."""
        by_id: dict[str, list[_Record]] = defaultdict(list)
        for rec in records:
            by_id[str(rec.payload.get("request_id"))].append(rec)
        for row in rows:
            name = f"request {row['request_id']}"
            chained = by_id.pop(row["request_id"], [])
            if not chained:
                self.problem("row_unchained", "hitl_requests", name, "no chained record mirrors this request",
                             run_id=run_id)
                continue
            decided = [r for r in chained if r.payload.get("status") != "pending"]
            self.diff("hitl_requests", name, mirror_records.hitl_request(row), (decided or chained)[-1], run_id)
            try:
                actions = json.loads(row["actions"])
            except (TypeError, json.JSONDecodeError):
                actions = row["actions"]
            if content_hash({"run_id": row["run_id"], "actions": actions}) != row["actions_hash"]:
                self.problem("row_mismatch", "hitl_requests", name,
                             "actions no longer hash to the chained actions_hash", run_id=run_id, field="actions")
        for request_id, chained in by_id.items():
            self.problem("record_without_row", "hitl_requests", f"request {request_id}",
                         f"the chained {chained[-1].where} has no row (deleted?)", run_id=run_id, rec=chained[-1])

    def run(self, row: Mapping[Any, Any], job: Mapping[Any, Any] | None, records: list[_Record]) -> None:
        """The Run's state, close reason, owner, times, result and legacy job against its transitions,
        its run_created event and its RunTrace."""
        run_id = row["run_id"]
        path = sorted((r for r in records if r.kind == "transition"), key=lambda r: int(r.payload.get("seq", -1)))
        if not path:
            self.problem("row_unchained", "runs", f"run {run_id}", "no transition of the Run is chained",
                         run_id=run_id)
            return
        last = path[-1]
        expected: dict[str, Any] = {"state": last.payload.get("to"), "version": last.payload.get("seq"),
                                    "last_state_change_at": last.payload.get("at"),
                                    "close_reason": _close_reason(path)}
        if path[0].payload.get("seq") == 0:
            expected["created_at"] = path[0].payload.get("at")
        created = next((r for r in records if r.kind == "audit" and r.payload.get("event") == RUN_CREATED), None)
        if created is not None:
            detail = created.payload.get("detail") or {}
            expected.update({k: detail[k] for k in ("tenant_id", "user_id", "retry_of", "session_id") if k in detail})
        self._fields("runs", f"run {run_id}", row, expected, last, run_id, created)
        self._run_trace(row, records, run_id)
        state = str(last.payload.get("to"))
        if job is None:
            self.problem("row_unchained", "jobs", f"job {run_id}", "the Run has no legacy job row", run_id=run_id)
        elif state in RunState.__members__:
            self._fields("jobs", f"job {run_id}", job, {"status": job_status(RunState(state)).value,
                                                        "run_state_snapshot": state,
                                                        "updated_at": last.payload.get("at")}, last, run_id)

    def _fields(self, table: str, name: str, row: Mapping[Any, Any], expected: Mapping[Any, Any], rec: _Record,
                run_id: str, created: _Record | None = None) -> None:
        self.report.rows_checked += 1
        for column, value in expected.items():
            if not _same(row[column], value):
                source = created if created is not None and column in ("tenant_id", "user_id", "retry_of",
                                                                        "session_id") else rec
                self.problem("row_mismatch", table, name,
                             f"{column} is {row[column]!r} but its chained {source.where} says {value!r}",
                             run_id=run_id, rec=source, field=column)

    def _run_trace(self, row: Mapping[Any, Any], records: list[_Record], run_id: str) -> None:
        traces = [r for r in records if r.kind == RUN_TRACE]
        if not traces:
            if row["state"] in _FINAL_VALUES:
                self.problem("run_trace_missing", "runs", f"run {run_id}",
                             f"state {row['state']} but the Run has no RunTrace record", run_id=run_id, field="state")
            return
        trace = traces[-1]
        payload = trace.payload
        expected: dict[str, Any] = {"state": payload.get("final_state"), "close_reason": payload.get("close_reason"),
                    **{k: payload.get(k) for k in ("tenant_id", "user_id", "session_id", "retry_of", "parent_run_id")
                       if k in payload}}
        self._fields("runs", f"run {run_id}", row, expected, trace, run_id)
        if int(payload.get("v") or 1) < commitment.RUN_TRACE_VERSION:
            self.legacy_run_traces += 1
            return
        result = _parsed(row["result"]) if row["result"] is not None else None
        digest = None if result is None else content_hash(result)
        if digest != payload.get("result_hash"):
            self.problem("row_mismatch", "runs", f"run {run_id}",
                         f"result does not hash to the result_hash of its RunTrace ({trace.where})",
                         run_id=run_id, rec=trace, field="result")
        self._committed(payload, records, trace, run_id)

    def _committed(self, payload: dict[str, Any], records: list[_Record], trace: _Record, run_id: str) -> None:
        """Every record the RunTrace names must still be there, chained or waiting in the outbox."""
        try:
            named = commitment.decode(payload.get(commitment.RECORDS_KEY))
        except commitment.CommitmentError as exc:
            self.report.add(Problem("edited", trace.seq, trace.record_id, f"RunTrace of run {run_id}: {exc}", run_id))
            return
        present = {r.record_id for r in records}
        for record_id, kind in sorted(named.items()):
            if record_id not in present:
                self.report.add(Problem("run_record_missing", None, record_id,
                                        f"the RunTrace ({trace.where}) names a {kind} record {record_id} that the "
                                        "chain no longer holds", run_id))


_FINAL_VALUES = {s.value for s in FINAL}


def _close_reason(path: list[_Record]) -> str | None:
    """The close reason the chained transitions lead to (the kernel's rule, replayed)."""
    reason: CloseReason | None = None
    for rec in path:
        source, target = str(rec.payload.get("from")), str(rec.payload.get("to"))
        if source in RunState.__members__ and target in RunState.__members__:
            reason = close_reason_on_entry(RunState(source), RunState(target), reason)
    return reason.value if reason else None


def _records_of(conn: sa.Connection, run_ids: list[str] | None) -> dict[str | None, list[_Record]]:
    """The records of these Runs (None: of no Run), outbox first so a record drained meanwhile is seen
    (once: by id), payloads only for the mirrored kinds."""
    found: dict[str | None, dict[str, _Record]] = defaultdict(dict)
    for table, seq in ((t.outbox, sa.null()), (t.trace_records, t.trace_records.c.seq)):
        payload = sa.case((table.c.kind.in_(_MIRRORED), table.c.payload), else_=sa.null())
        where = table.c.run_id.is_(None) if run_ids is None else table.c.run_id.in_(run_ids)
        order = table.c.id if table is t.outbox else table.c.seq
        query = sa.select(seq, table.c.record_id, table.c.run_id, table.c.kind, payload).where(where).order_by(order)
        for r in conn.execute(query):
            found[r[2]][r[1]] = _Record(r[0], r[1], r[3], _parsed(r[4]))
    return {k: sorted(v.values(), key=lambda r: (r.seq is None, r.seq or 0)) for k, v in found.items()}


def _columns(conn: sa.Connection, table: sa.Table) -> list[sa.Column[Any]]:
    """The table's columns this database has: a database at an older revision (opened without migrating)
    lacks the newer ones, and what its rows do not hold is not compared."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    return [c for c in table.c if c.name in present]


def _rows_of(conn: sa.Connection, table: sa.Table, run_ids: list[str],
             columns: list[sa.Column[Any]]) -> dict[str, list[Mapping[Any, Any]]]:
    grouped: dict[str, list[Mapping[Any, Any]]] = defaultdict(list)
    order = table.c.seq if table is t.transitions else table.c.id if "id" in table.c else table.c.created_at
    for r in conn.execute(sa.select(*columns).where(table.c.run_id.in_(run_ids)).order_by(order)).mappings():
        grouped[r["run_id"]].append(r)
    return grouped


def _snapshot(store: SqlStore) -> sa.Connection:
    """A read connection whose transaction sees one snapshot (records and rows of a live database agree)."""
    conn = store.reader.connect()
    if store.engine.dialect.name != "sqlite":  # SQLite's deferred BEGIN already reads one WAL snapshot
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


def _check_batch(store: SqlStore, checker: _Checker, run_ids: list[str]) -> None:
    with _snapshot(store) as conn, conn.begin():
        records = _records_of(conn, run_ids)
        cols = checker.columns(conn)
        runs = {r["run_id"]: r for r in conn.execute(
            sa.select(*cols[t.runs.name]).where(t.runs.c.run_id.in_(run_ids))).mappings()}
        jobs = {r["job_id"]: r for r in conn.execute(
            sa.select(*cols[t.jobs.name]).where(t.jobs.c.job_id.in_(run_ids))).mappings()}
        rows = {table.name: _rows_of(conn, table, run_ids, cols[table.name]) for table in _ROW_TABLES}
    for run_id in run_ids:
        recs = records.get(run_id, [])
        if not recs or run_id not in runs:
            continue  # a Run with no record at all is named by verify (run_trace_missing)
        _check_run(checker, run_id, runs[run_id], jobs.get(run_id), recs,
                   {name: grouped.get(run_id, []) for name, grouped in rows.items()})


def _check_run(checker: _Checker, run_id: str, row: Mapping[Any, Any], job: Mapping[Any, Any] | None,
               recs: list[_Record], rows: Mapping[str, Sequence[Mapping[Any, Any]]]) -> None:
    """One Run's rows (by table name) against its records."""
    kinds: dict[str, list[_Record]] = defaultdict(list)
    for rec in recs:
        kinds[rec.kind].append(rec)
    checker.keyed("transitions", rows.get("transitions", []), kinds["transition"], "seq",
                  mirror_records.transition, lambda r: f"run {r['run_id']} seq {r['seq']}", run_id,
                  unchained="transition_record_missing")
    _audit_rows(checker, rows.get("audit_events", []), kinds["audit"], run_id)
    checker.costs(list(rows.get("costs", [])), kinds["cost"], run_id)
    checker.requests(list(rows.get("hitl_requests", [])), kinds[mirror_records.HITL_REQUEST], run_id)
    checker.keyed("hitl_decisions", rows.get("hitl_decisions", []), kinds[mirror_records.HITL_DECISION],
                  "decision_id", mirror_records.hitl_decision, lambda r: f"decision {r['decision_id']}", run_id)
    checker.run(row, job, recs)


def check_archived_run(line: Mapping[str, Any], report: ChainReport) -> None:
    """An archived Run's rows, as its segment line holds them (`run`, `job`, `tables`), against the
    records of the same line, as verify checks a live Run's: the records are what the segment proves;
    the rows, which a read-back shows, are proven only through them. Problems go to `report`."""
    records = sorted((_Record(int(r["seq"]), str(r["record_id"]), str(r["kind"]),
                              _parsed(r["payload"]) if r["kind"] in _MIRRORED else {})
                      for r in line.get("records", [])), key=lambda r: r.seq or 0)
    tables = line.get("tables") or {}
    _check_run(_Checker(report), str(line.get("run_id")), line.get("run") or {}, line.get("job"), records,
               {name: tables.get(name, []) for name in ("transitions", "audit_events", "costs", "hitl_requests",
                                                        "hitl_decisions")})


def _audit_rows(checker: _Checker, rows: Sequence[Mapping[Any, Any]], records: list[_Record],
                run_id: str | None) -> None:
    checker.keyed("audit_events", rows, records, "event_id", mirror_records.audit_event,
                  lambda r: f"event {r['event_id']} ({r['event']})", run_id)


def _check_runless(store: SqlStore, checker: _Checker) -> None:
    """Audit events of no Run (e.g. an illegal transition asked for an unknown Run)."""
    with _snapshot(store) as conn, conn.begin():
        records = [r for r in _records_of(conn, None).get(None, []) if r.kind == "audit"]
        rows = list(conn.execute(sa.select(t.audit_events).where(t.audit_events.c.run_id.is_(None))
                                 .order_by(t.audit_events.c.id)).mappings())
    _audit_rows(checker, rows, records, None)


def _check_orphans(store: SqlStore, checker: _Checker, limit: int) -> None:
    """Rows and records that name a Run the runs table does not hold (its row deleted?)."""
    def no_run(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        return sa.and_(column.is_not(None), ~sa.exists().where(t.runs.c.run_id == column))

    with store.reader.connect() as conn:
        for table in (*_ROW_TABLES, t.jobs):
            column = table.c.job_id if table is t.jobs else table.c.run_id
            for run_id in conn.execute(sa.select(column).where(no_run(column)).distinct().limit(limit)).scalars():
                checker.problem("row_of_no_run", table.name, f"run {run_id}", "rows of a Run that has no runs row",
                                run_id=run_id)
        for table in (t.trace_records, t.outbox):
            query = sa.select(table.c.run_id).where(no_run(table.c.run_id)).distinct().limit(limit)
            for run_id in conn.execute(query).scalars():
                checker.problem("run_row_missing", "runs", f"run {run_id}",
                                f"{table.name} holds records of this Run but the runs table has no row for it",
                                run_id=run_id)


def check_rows(store: SqlStore, report: ChainReport, *, batch: int = 200) -> None:
    """Check every mirrored row against its record; problems go to `report`, the rest to its warnings."""
    checker = _Checker(report)
    after = ""
    with store.reader.connect() as conn:
        erasable = sa.inspect(conn).has_table(erased_runs.name)  # not on a database of an earlier version
    while True:
        with store.reader.connect() as conn:
            query = sa.select(t.runs.c.run_id).where(t.runs.c.run_id > after)
            if erasable:
                # a Run whose personal data an erasure replaced has no rows left that its records could prove
                query = query.where(~sa.exists().where(erased_runs.c.run_id == t.runs.c.run_id))
            ids = list(conn.execute(query.order_by(t.runs.c.run_id).limit(batch)).scalars())
        if not ids:
            break
        _check_batch(store, checker, ids)
        after = ids[-1]
    _check_runless(store, checker)
    _check_orphans(store, checker, report.limit)
    if checker.legacy_run_traces:
        report.warnings.append(
            f"{checker.legacy_run_traces} Run(s) were closed by a version whose RunTrace commits neither to "
            "the Run's result nor to its records: their results and completeness are not proven by the chain")
