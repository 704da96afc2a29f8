"""The database side of retention: which Runs may go, what they hold, the audited prune, the tombstones.

The prune (`RetentionStore.prune`) is the only code that deletes from the append-only tables. In one
transaction per batch of Runs it grants the Runs (prune_grants), checks that every stored record of
theirs is, field for field, the record the verified segment holds (none missing, none extra), writes a
tombstone per trace record (its chain hash and Merkle leaf hash), deletes the Runs' rows and records,
notes them in archived_runs, revokes the grants and writes the `runs_pruned` audit event. A Run that
gained a record after the segment's checkpoint (or has one waiting in the outbox) is left in place and
reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.raw import RawStatements
from harness.adapters.sql.retention_schema import (
    archive_segments,
    archived_costs,
    archived_runs,
    prune_grants,
    pruned_records,
    redacted_records,
)
from harness.adapters.sql.store import SqlStore
from harness.adapters.sql.store_base import stored_record
from harness.domain.errors import StoreError
from harness.domain.records import StoredTraceRecord
from harness.domain.retention import ARCHIVE_SEGMENT, ArchivedRun, PruneResult
from harness.kernel.states import FINAL

RUNS_PRUNED = "runs_pruned"
#: the tables whose rows of a Run the segment carries (as read back by `--from-archive`) and prune deletes
RUN_TABLES = (t.transitions, t.audit_events, t.costs, t.hitl_decisions, t.hitl_requests, t.webhook_deliveries)
_FINAL = sorted(s.value for s in FINAL)
#: a trace record's columns in the order of StoredTraceRecord
_RECORD = (t.trace_records.c.seq, t.trace_records.c.record_id, t.trace_records.c.run_id, t.trace_records.c.kind,
           t.trace_records.c.payload, t.trace_records.c.prev_hash, t.trace_records.c.hash)
#: Runs per statement when reading what goes (IN lists of at most this many ids)
_READ_CHUNK = 1000


class PruneRefusedError(StoreError):
    """A Run's stored records are no longer the ones its segment holds (edited, added or gone since they
    were archived): nothing of the batch is pruned (run `harness audit verify`)."""


def _dicts(conn: sa.Connection, query: sa.Select[Any]) -> Iterator[dict[str, Any]]:
    """The rows as dicts (zipped with the column names: a third cheaper than `.mappings()` per row)."""
    result = conn.execute(query)
    keys = list(result.keys())
    for row in result:
        yield dict(zip(keys, row, strict=True))


class RetentionStore:
    """Retention's reads and its one write path over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        #: the chain as checkpoints read it (the archive publishes the checkpoint that proves a segment)
        self.chain = SqlAuditReads(store)
        self._raw = RawStatements(store.engine.dialect)
        self._by_array = store.engine.dialect.name == "postgresql"

    # ------------------------------------------------------------------ the store's side of a pass

    def audit(self, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write a run-less audit event (and its record) in its own transaction."""
        self.store.audit(None, event, actor, detail)

    # ------------------------------------------------------------------ choosing

    def eligible_runs(self, default_cutoff: float | None, tenant_cutoffs: Mapping[str, float | None],
                      limit: int) -> list[str]:
        """Final Runs whose last change is older than their tenant's cutoff (None: kept forever), oldest
        first, with every Run of their family (parent, children) final and old enough too."""
        runs = t.runs.c
        clauses = []
        for tenant, cutoff in tenant_cutoffs.items():
            if cutoff is not None:
                clauses.append(sa.and_(runs.tenant_id == tenant, runs.last_state_change_at < cutoff))
        if default_cutoff is not None:
            clauses.append(sa.and_(runs.tenant_id.not_in(list(tenant_cutoffs)) if tenant_cutoffs else sa.true(),
                                   runs.last_state_change_at < default_cutoff))
        if not clauses:
            return []
        query = (sa.select(runs.run_id, runs.parent_run_id).where(runs.state.in_(_FINAL), sa.or_(*clauses))
                 .order_by(runs.last_state_change_at, runs.run_id).limit(limit))
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
            chosen = {r.run_id for r in rows}
            parents = {r.run_id: r.parent_run_id for r in rows}
            children = conn.execute(sa.select(runs.run_id, runs.parent_run_id)
                                    .where(runs.parent_run_id.in_(list(chosen)))).all() if chosen else []
        # a Run goes with its whole family or not at all: cost totals and commitments span it
        kids: dict[str, set[str]] = {}
        for r in children:
            kids.setdefault(r.parent_run_id, set()).add(r.run_id)
        changed = True
        while changed:
            changed = False
            for run_id in sorted(chosen):
                parent = parents.get(run_id)
                if (parent is not None and parent not in chosen and self._exists(parent)) or \
                        not kids.get(run_id, set()) <= chosen:
                    chosen.discard(run_id)
                    changed = True
        return [r.run_id for r in rows if r.run_id in chosen]

    def _exists(self, run_id: str) -> bool:
        with self.store.reader.connect() as conn:
            return conn.execute(sa.select(t.runs.c.run_id).where(t.runs.c.run_id == run_id)).first() is not None

    # ------------------------------------------------------------------ reading what goes

    def bundle(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per Run: its runs row, its job row, its rows of RUN_TABLES and its chained records (read
        `_READ_CHUNK` Runs at a time; the records on the cursor, they are most of what is read)."""
        out: dict[str, dict[str, Any]] = {r: {"tables": {}, "records": [], "redacted": {}} for r in run_ids}
        with self.store.reader.connect() as conn:
            for i in range(0, len(run_ids), _READ_CHUNK):
                self._bundle_chunk(conn, list(run_ids[i : i + _READ_CHUNK]), out)
        return out

    def _bundle_chunk(self, conn: sa.Connection, ids: list[str], out: dict[str, dict[str, Any]]) -> None:
        for row in _dicts(conn, sa.select(t.runs).where(t.runs.c.run_id.in_(ids))):
            out[row["run_id"]]["run"] = row
        for row in _dicts(conn, sa.select(t.jobs).where(t.jobs.c.job_id.in_(ids))):
            out[row["job_id"]]["job"] = row
        for table in RUN_TABLES:
            query = sa.select(table).where(table.c.run_id.in_(ids)).order_by(*table.primary_key.columns)
            for row in _dicts(conn, query):
                out[row["run_id"]]["tables"].setdefault(table.name, []).append(row)
        for r in self._raw.rows(conn, self._records_of(ids)):
            out[r[2]]["records"].append(stored_record(r))
        # a record an erasure redacted goes into its segment as redacted: its original leaf hash with it
        x, rec = redacted_records.c, t.trace_records.c
        query = (sa.select(rec.run_id, x.seq, x.erase_id, x.leaf).join(t.trace_records, rec.seq == x.seq)
                 .where(rec.run_id.in_(ids)))
        for run_id, seq, erase_id, leaf in conn.execute(query):
            out[run_id]["redacted"][int(seq)] = {"erase_id": erase_id, "leaf": bytes(leaf).hex()}

    @staticmethod
    def _records_of(run_ids: list[str]) -> sa.Select[Any]:
        return sa.select(*_RECORD).where(t.trace_records.c.run_id.in_(run_ids)).order_by(t.trace_records.c.seq)

    def pending_of(self, run_ids: Sequence[str]) -> set[str]:
        """The Runs among `run_ids` with records still waiting in the outbox."""
        with self.store.reader.connect() as conn:
            return set(conn.execute(sa.select(t.outbox.c.run_id).where(t.outbox.c.run_id.in_(run_ids))
                                    .distinct()).scalars())

    def manifest_record(self, after_seq: int, segment_id: str) -> StoredTraceRecord | None:
        """The chained `archive_segment` audit record of `segment_id` (chained after `after_seq`)."""
        for rec in self.store.iter_trace(after_seq + 1):
            if rec.run_id is None and rec.kind == "audit" and ARCHIVE_SEGMENT in rec.payload:
                detail = rec.data().get("detail", {})
                if rec.data().get("event") == ARCHIVE_SEGMENT and detail.get("segment_id") == segment_id:
                    return rec
        return None

    # ------------------------------------------------------------------ segments

    def add_segment(self, segment_id: str, location: str, runs: int, records: int, digest: str, tree_size: int,
                    checkpoint: str) -> None:
        """Note a stored segment (not yet pruned)."""
        with self.store.engine.begin() as conn:
            conn.execute(archive_segments.insert().values(
                segment_id=segment_id, location=location, runs=runs, records=records, digest=digest,
                tree_size=tree_size, checkpoint=checkpoint, created_at=self.store.clock.now()))

    def segments(self) -> list[dict[str, Any]]:
        """Every segment, oldest first."""
        with self.store.reader.connect() as conn:
            return [dict(r) for r in conn.execute(sa.select(archive_segments)
                                                  .order_by(archive_segments.c.created_at)).mappings()]

    def archived(self, run_id: str) -> ArchivedRun | None:
        """Where an archived Run is, or None when the Run was never archived."""
        query = (sa.select(archived_runs, archive_segments.c.location, archive_segments.c.checkpoint)
                 .join(archive_segments, archive_segments.c.segment_id == archived_runs.c.segment_id)
                 .where(archived_runs.c.run_id == run_id))
        with self.store.reader.connect() as conn:
            row = conn.execute(query).mappings().first()
        return ArchivedRun(**{k: row[k] for k in ArchivedRun.__slots__}) if row else None

    # ------------------------------------------------------------------ the prune

    def prune(self, segment_id: str, archived: Mapping[str, Sequence[StoredTraceRecord]], tree_size: int,
              leaf: Callable[[int], bytes], actor: str, batch: int = 500) -> PruneResult:
        """Delete the Runs of `archived` (its records, by Run, as segment `segment_id` holds them, proven
        against a checkpoint of `tree_size` whose tree gives `leaf(index)`), keeping a tombstone per
        record; batches of `batch` Runs, one transaction each."""
        result = PruneResult()
        run_ids = list(archived)
        for i in range(0, len(run_ids), batch):
            self._prune_batch(segment_id, run_ids[i : i + batch], archived, tree_size, leaf, actor, result)
        with self.store.engine.begin() as conn:
            conn.execute(archive_segments.update().where(archive_segments.c.segment_id == segment_id)
                         .values(pruned_at=self.store.clock.now()))
        return result

    def _prune_batch(self, segment_id: str, run_ids: list[str], archived: Mapping[str, Sequence[StoredTraceRecord]],
                     tree_size: int, leaf: Callable[[int], bytes], actor: str, result: PruneResult) -> None:
        now = self.store.clock.now()
        with self.store.engine.begin() as conn:
            rows = conn.execute(sa.select(t.runs).where(t.runs.c.run_id.in_(run_ids))
                                .with_for_update()).mappings().all()
            late = set(conn.execute(sa.select(t.outbox.c.run_id).where(t.outbox.c.run_id.in_(run_ids))).scalars())
            late |= set(conn.execute(sa.select(t.trace_records.c.run_id).where(
                t.trace_records.c.run_id.in_(run_ids), t.trace_records.c.seq > tree_size)).scalars())
            late |= {r["run_id"] for r in rows if r["state"] not in _FINAL}
            runs = [r for r in rows if r["run_id"] not in late]
            result.kept += sorted(late & set(run_ids))
            ids = [r["run_id"] for r in runs]
            if not ids:
                return
            self._insert(conn, prune_grants, [{"run_id": r, "segment_id": segment_id} for r in ids])
            tombstones = self._tombstones(conn, ids, archived, leaf)
            if tombstones:
                self._insert(conn, pruned_records, tombstones)
            self._archive_costs(conn, segment_id, ids, archived)
            requests = sa.select(t.hitl_requests.c.request_id).where(t.hitl_requests.c.run_id.in_(ids))
            conn.execute(t.hitl_approvals.delete().where(t.hitl_approvals.c.request_id.in_(requests)))
            for table in (*RUN_TABLES, t.trace_records):
                conn.execute(table.delete().where(table.c.run_id.in_(ids)))
            conn.execute(t.jobs.delete().where(t.jobs.c.job_id.in_(ids)))
            conn.execute(t.runs.delete().where(t.runs.c.run_id.in_(ids)))
            self._insert(conn, archived_runs, [
                {"run_id": r["run_id"], "segment_id": segment_id, "tenant_id": r["tenant_id"], "user_id": r["user_id"],
                 "state": r["state"],
                 "created_at": r["created_at"], "closed_at": r["last_state_change_at"], "archived_at": now}
                for r in runs])
            conn.execute(prune_grants.delete().where(prune_grants.c.segment_id == segment_id))
            self.store.write_audit(conn, None, RUNS_PRUNED, actor, {
                "segment_id": segment_id, "runs": len(ids), "records": len(tombstones),
                "first_run": ids[0], "last_run": ids[-1]})
        result.runs += len(ids)
        result.records += len(tombstones)

    def _tombstones(self, conn: sa.Connection, run_ids: list[str], archived: Mapping[str, Sequence[StoredTraceRecord]],
                    leaf: Callable[[int], bytes]) -> list[dict[str, Any]]:
        """A tombstone per stored record of the Runs, each of which must be the very record the segment
        holds (the segment was checked record by record against the signed root, so the stored record
        then matches its hash too); PruneRefusedError for one edited, one the segment lacks, or one gone."""
        expected = {rec.seq: rec for run_id in run_ids for rec in archived[run_id]}
        out = []
        for row in self._raw.rows(conn, self._records_of(run_ids)):
            rec = expected.pop(row[0], None)
            if rec is None or stored_record(row) != rec:
                raise PruneRefusedError(f"record seq {row[0]} of run {row[2]} is not the record its segment holds "
                                        "(edited or added since it was archived): nothing was pruned; run "
                                        "`harness audit verify`")
            out.append({"seq": rec.seq, "hash": bytes.fromhex(rec.hash), "leaf": leaf(rec.seq - 1)})
        if expected:
            rec = expected[min(expected)]
            raise PruneRefusedError(f"record seq {rec.seq} of run {rec.run_id} is in its segment but no longer in "
                                    "the database: nothing was pruned; run `harness audit verify`")
        return out

    @staticmethod
    def _archive_costs(conn: sa.Connection, segment_id: str, run_ids: list[str],
                       archived: Mapping[str, Sequence[StoredTraceRecord]]) -> None:
        """Add what the Runs' costs added to the spend totals to the segment's `archived_costs` rows, once
        each Run's costs rows are the cost records its segment proves (tenant, user and USD, one for one);
        a Run whose cost records an erasure redacted is taken by its rows (they carry the pseudonym)."""
        c = t.costs.c
        rows = conn.execute(sa.select(c.run_id, c.tenant_id, c.user_id, c.usd).where(c.run_id.in_(run_ids))).all()
        by_run: dict[str, list[tuple[str, str, float]]] = {}
        for r in rows:
            by_run.setdefault(r.run_id, []).append((r.tenant_id, r.user_id, float(r.usd)))
        for run_id in run_ids:
            proven = [rec.data() for rec in archived[run_id] if rec.kind == "cost"]
            if any("usd" not in doc for doc in proven):
                continue  # redacted by an erasure: the content is no longer proven
            if sorted(by_run.get(run_id, [])) != sorted((d["tenant_id"], d["user_id"], float(d["usd"]))
                                                        for d in proven):
                raise PruneRefusedError(f"the costs rows of run {run_id} are not the cost records its segment "
                                        "holds: nothing was pruned; run `harness audit verify`")
        sums: dict[tuple[str, str], tuple[float, int]] = {}
        for tenant, user, usd in (x for run in by_run.values() for x in run):
            total, n = sums.get((tenant, user), (0.0, 0))
            sums[(tenant, user)] = (total + usd, n + 1)
        a = archived_costs.c
        for (tenant, user), (usd, n) in sorted(sums.items()):
            key = sa.and_(a.segment_id == segment_id, a.tenant_id == tenant, a.user_id == user)
            if conn.execute(sa.select(a.segment_id).where(key)).first() is None:
                conn.execute(archived_costs.insert().values(segment_id=segment_id, tenant_id=tenant, user_id=user,
                                                            usd=usd, cost_count=n))
            else:
                conn.execute(archived_costs.update().where(key).values(usd=a.usd + usd,
                                                                       cost_count=a.cost_count + n))

    def _insert(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """Many rows in one statement: on PostgreSQL one array per column, unnested (psycopg's executemany
        would send a statement per row); elsewhere the driver's executemany, which PyMySQL folds into one
        multi-row INSERT and SQLite runs in process."""
        if not self._by_array:
            self._raw.executemany(conn, _INSERT[table.name], rows)
            return
        names = list(rows[0])
        conn.execute(_unnest_insert(table, tuple(names)), {f"p_{n}": [r[n] for r in rows] for n in names})


#: built once: RawStatements caches a statement's compiled form by the statement object
_INSERT = {table.name: table.insert() for table in (prune_grants, pruned_records, archived_runs)}
_UNNEST: dict[tuple[str, tuple[str, ...]], sa.Insert] = {}


def _unnest_insert(table: sa.Table, names: tuple[str, ...]) -> sa.Insert:
    """INSERT INTO table (names) SELECT unnest(:p_name), ... (PostgreSQL), built once per table."""
    key = (table.name, names)
    if key not in _UNNEST:
        from sqlalchemy.dialects import postgresql as pg  # PostgreSQL only: a SQLite process never loads it

        arrays = [sa.func.unnest(sa.bindparam(f"p_{n}", type_=pg.ARRAY(table.c[n].type))) for n in names]
        _UNNEST[key] = table.insert().from_select(list(names), sa.select(*arrays))
    return _UNNEST[key]
