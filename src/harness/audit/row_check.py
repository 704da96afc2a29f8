"""The rows people read, checked against the chained records they mirror (SPEC A1-A3, K8). Pure, no I/O.

`runs show`, the console, the API and a read-back of an archived Run show rows; only the chain is
tamper-evident. For every row that mirrors a record — transitions, audit events, costs, approval
requests and decisions, a Run's state, close reason, owner, result and path, its legacy job — the payload
the row implies (audit.mirror_records) is compared field by field with the chained record, and each
difference is named by table, row and field. A Run's RunTrace also names every other record the Run had
when it closed (audit.commitment): one that is gone is named.

The SQL adapter (adapters.sql.audit_mirrors) feeds it a live database's rows and records; an archive
segment's Run line holds both (`check_archived_run`), which `harness-verify segment` checks with no
database.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.audit import commitment, mirror_records
from harness.domain.audit import ChainReport, Problem
from harness.domain.chain import canonical_json, content_hash
from harness.domain.records import RUN_TRACE
from harness.kernel.events import RUN_CREATED
from harness.kernel.projection import job_status
from harness.kernel.states import FINAL, CloseReason, RunState
from harness.kernel.transitions import close_reason_on_entry

MIRRORED = ("transition", "audit", "cost", RUN_TRACE, mirror_records.HITL_REQUEST, mirror_records.HITL_DECISION)
#: payload keys whose column is named otherwise
_COLUMN = {"transitions": {"from": "from_state", "to": "to_state"}}
_MISSING = object()
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class Record:
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


def parsed(payload: str | None) -> dict[str, Any]:
    try:
        value = json.loads(payload) if payload else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class RowChecker:
    """Adds one Problem per field that differs; counts the rows it checked."""

    def __init__(self, report: ChainReport) -> None:
        self.report = report
        self.legacy_run_traces = 0

    def problem(self, kind: str, table: str, row: str, detail: str, *, run_id: str | None,
                rec: Record | None = None, field: str | None = None) -> None:
        self.report.add(Problem(kind, rec.seq if rec else None, rec.record_id if rec else None,
                                f"{table} {row}: {detail}", run_id, table, row, field))

    def diff(self, table: str, row: str, expected: Mapping[Any, Any], rec: Record, run_id: str | None) -> None:
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

    def keyed(self, table: str, rows: Iterable[Mapping[Any, Any]], records: Iterable[Record], key: str,
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

    def costs(self, rows: list[Mapping[Any, Any]], records: list[Record], run_id: str) -> None:
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

    def requests(self, rows: list[Mapping[Any, Any]], records: list[Record], run_id: str) -> None:
        """An approval request against the chained record of its last write (its decided status, if any:
        a status moves once, from pending)."""
        by_id: dict[str, list[Record]] = defaultdict(list)
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

    def run(self, row: Mapping[Any, Any], job: Mapping[Any, Any] | None, records: list[Record]) -> None:
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

    def _fields(self, table: str, name: str, row: Mapping[Any, Any], expected: Mapping[Any, Any], rec: Record,
                run_id: str, created: Record | None = None) -> None:
        self.report.rows_checked += 1
        for column, value in expected.items():
            if not _same(row[column], value):
                source = created if created is not None and column in ("tenant_id", "user_id", "retry_of",
                                                                        "session_id") else rec
                self.problem("row_mismatch", table, name,
                             f"{column} is {row[column]!r} but its chained {source.where} says {value!r}",
                             run_id=run_id, rec=source, field=column)

    def _run_trace(self, row: Mapping[Any, Any], records: list[Record], run_id: str) -> None:
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
        result = parsed(row["result"]) if row["result"] is not None else None
        digest = None if result is None else content_hash(result)
        if digest != payload.get("result_hash"):
            self.problem("row_mismatch", "runs", f"run {run_id}",
                         f"result does not hash to the result_hash of its RunTrace ({trace.where})",
                         run_id=run_id, rec=trace, field="result")
        self._committed(payload, records, trace, run_id)

    def _committed(self, payload: dict[str, Any], records: list[Record], trace: Record, run_id: str) -> None:
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


def _close_reason(path: list[Record]) -> str | None:
    """The close reason the chained transitions lead to (the kernel's rule, replayed)."""
    reason: CloseReason | None = None
    for rec in path:
        source, target = str(rec.payload.get("from")), str(rec.payload.get("to"))
        if source in RunState.__members__ and target in RunState.__members__:
            reason = close_reason_on_entry(RunState(source), RunState(target), reason)
    return reason.value if reason else None


def check_run(checker: RowChecker, run_id: str, row: Mapping[Any, Any], job: Mapping[Any, Any] | None,
               recs: list[Record], rows: Mapping[str, Sequence[Mapping[Any, Any]]]) -> None:
    """One Run's rows (by table name) against its records."""
    kinds: dict[str, list[Record]] = defaultdict(list)
    for rec in recs:
        kinds[rec.kind].append(rec)
    checker.keyed("transitions", rows.get("transitions", []), kinds["transition"], "seq",
                  mirror_records.transition, lambda r: f"run {r['run_id']} seq {r['seq']}", run_id,
                  unchained="transition_record_missing")
    audit_rows(checker, rows.get("audit_events", []), kinds["audit"], run_id)
    checker.costs(list(rows.get("costs", [])), kinds["cost"], run_id)
    checker.requests(list(rows.get("hitl_requests", [])), kinds[mirror_records.HITL_REQUEST], run_id)
    checker.keyed("hitl_decisions", rows.get("hitl_decisions", []), kinds[mirror_records.HITL_DECISION],
                  "decision_id", mirror_records.hitl_decision, lambda r: f"decision {r['decision_id']}", run_id)
    checker.run(row, job, recs)


def check_archived_run(line: Mapping[str, Any], report: ChainReport) -> None:
    """An archived Run's rows, as its segment line holds them (`run`, `job`, `tables`), against the
    records of the same line, as verify checks a live Run's: the records are what the segment proves;
    the rows, which a read-back shows, are proven only through them. Problems go to `report`."""
    records = sorted((Record(int(r["seq"]), str(r["record_id"]), str(r["kind"]),
                              parsed(r["payload"]) if r["kind"] in MIRRORED else {})
                      for r in line.get("records", [])), key=lambda r: r.seq or 0)
    tables = line.get("tables") or {}
    check_run(RowChecker(report), str(line.get("run_id")), line.get("run") or {}, line.get("job"), records,
               {name: tables.get(name, []) for name in ("transitions", "audit_events", "costs", "hitl_requests",
                                                        "hitl_decisions")})


def audit_rows(checker: RowChecker, rows: Sequence[Mapping[Any, Any]], records: list[Record],
                run_id: str | None) -> None:
    checker.keyed("audit_events", rows, records, "event_id", mirror_records.audit_event,
                  lambda r: f"event {r['event_id']} ({r['event']})", run_id)


