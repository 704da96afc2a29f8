"""The append-only triggers, with two audited doors: the prune and the erasure (migration 0014).

DELETE is refused on every append-only table except for the rows of a Run named in `prune_grants`: the
archiver (harness.retention) inserts a Run's grant, moves its records to `pruned_records` (their
hashes), deletes its rows and removes the grant, all in one transaction that also writes the
`runs_pruned` audit event. UPDATE is refused except for an erasure (grant `erase:<id>`), which rewrites a
granted Run's rows and the payloads of its trace records, never a record's seq, ids, link or chain hash,
and only once the record's original hashes are in `redacted_records`. A grant never outlives its
transaction, so outside it the tables are as append-only as before; someone who can write grants can
also drop triggers, which is why the chain, the tombstones and the signed checkpoints, not the triggers,
are what prove the history.
"""

from __future__ import annotations

#: the append-only tables whose rows belong to one Run, and how a row names its Run
PRUNABLE: dict[str, str] = {
    "transitions": "run_id",
    "audit_events": "run_id",
    "trace_records": "run_id",
    "costs": "run_id",
    "hitl_decisions": "run_id",
    "hitl_approvals": "request_id",
}


def _granted(table: str) -> str:
    """An SQL condition, over OLD, that is true when the row's Run holds a prune grant."""
    if PRUNABLE[table] == "request_id":
        return ("EXISTS (SELECT 1 FROM prune_grants g JOIN hitl_requests r ON r.run_id = g.run_id "
                "WHERE r.request_id = OLD.request_id)")
    return "EXISTS (SELECT 1 FROM prune_grants g WHERE g.run_id = OLD.run_id)"


def _same(dialect: str, column: str) -> str:
    """NEW.column equals OLD.column, NULL-safe."""
    op = {"sqlite": "IS", "postgresql": "IS NOT DISTINCT FROM"}.get(dialect, "<=>")
    return f"NEW.{column} {op} OLD.{column}"


def _erasable(dialect: str, table: str) -> str | None:
    """An SQL condition, over OLD and NEW, that is true for an erasure's UPDATE of a row of `table`: its
    Run holds an erase grant (`erase:<id>`) and the row keeps its Run; a trace record, besides, keeps its
    seq, ids, kind, link and chain hash, and has its original hashes in redacted_records already. None for
    a table whose rows an erasure never changes."""
    if table == "hitl_approvals":
        return None
    granted = ("EXISTS (SELECT 1 FROM prune_grants g WHERE g.run_id = OLD.run_id "
               f"AND substr(g.segment_id, 1, 6) = 'erase:') AND {_same(dialect, 'run_id')}")
    if table != "trace_records":
        return f"({granted})"
    kept = " AND ".join(_same(dialect, c) for c in ("seq", "record_id", "kind", "prev_hash", "hash"))
    return f"({granted} AND EXISTS (SELECT 1 FROM redacted_records x WHERE x.seq = OLD.seq) AND {kept})"


def guarded_delete_ddl(dialect: str, table: str) -> list[str]:
    """Statements that replace `table`'s guards: DELETE lets a granted Run's rows go (the prune), UPDATE
    lets an erasure rewrite a granted Run's rows (see _erasable); everything else is refused as before."""
    message = f"{table} is append-only"
    update = _erasable(dialect, table)
    if dialect == "sqlite":
        guards = [("DELETE", _granted(table)), ("UPDATE", update)]
        return [statement for verb, allowed in guards for statement in (
            f"DROP TRIGGER IF EXISTS {table}_no_{verb.lower()}",
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            + (f"WHEN NOT {allowed} " if allowed else "") + f"BEGIN SELECT RAISE(ABORT, '{message}'); END")]
    if dialect == "postgresql":
        # one function serves the row trigger (UPDATE OR DELETE) and the TRUNCATE statement trigger
        on_update = f"IF TG_OP = 'UPDATE' THEN IF {update} THEN RETURN NEW; END IF; END IF; " if update else ""
        return [
            f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ BEGIN "
            f"IF TG_OP = 'DELETE' THEN IF {_granted(table)} THEN RETURN OLD; END IF; END IF; {on_update}"
            f"RAISE EXCEPTION '{message}'; END; $$ LANGUAGE plpgsql",
        ]
    if dialect in ("mysql", "mariadb"):
        guards = [("DELETE", _granted(table)), ("UPDATE", update)]
        return [statement for verb, allowed in guards for statement in (
            f"DROP TRIGGER IF EXISTS {table}_no_{verb.lower()}",
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} FOR EACH ROW "
            + (f"BEGIN IF NOT {allowed} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'; END IF; END"
               if allowed else f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'"))]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")


def plain_delete_ddl(dialect: str, table: str) -> list[str]:
    """Statements that restore the DELETE guard without a door (the downgrade of 0014)."""
    message = f"{table} is append-only"
    if dialect == "sqlite":
        return [statement for verb in ("DELETE", "UPDATE") for statement in (
            f"DROP TRIGGER IF EXISTS {table}_no_{verb.lower()}",
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END")]
    if dialect == "postgresql":
        return [f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ "
                f"BEGIN RAISE EXCEPTION '{message}'; END; $$ LANGUAGE plpgsql"]
    if dialect in ("mysql", "mariadb"):
        return [statement for verb in ("DELETE", "UPDATE") for statement in (
            f"DROP TRIGGER IF EXISTS {table}_no_{verb.lower()}",
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'")]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")
