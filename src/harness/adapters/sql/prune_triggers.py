"""The append-only triggers, with one door: the audited prune path (migration 0014).

UPDATE stays refused on every append-only table. DELETE is refused too, except for the rows of a Run
named in `prune_grants`: the archiver (harness.retention) inserts a Run's grant, moves its records to
`pruned_records` (their hashes), deletes its rows and removes the grant, all in one transaction that
also writes the `runs_pruned` audit event. A grant never outlives that transaction, so outside it the
tables are as append-only as before; someone who can write grants can also drop triggers, which is why
the chain, the tombstones and the signed checkpoints, not the triggers, are what prove the history.
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


def guarded_delete_ddl(dialect: str, table: str) -> list[str]:
    """Statements that replace `table`'s DELETE guard by one that lets granted Runs' rows go."""
    message = f"{table} is append-only"
    if dialect == "sqlite":
        return [
            f"DROP TRIGGER IF EXISTS {table}_no_delete",
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} WHEN NOT {_granted(table)} "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END",
        ]
    if dialect == "postgresql":
        # one function serves the row trigger (UPDATE OR DELETE) and the TRUNCATE statement trigger
        return [
            f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ BEGIN "
            f"IF TG_OP = 'DELETE' THEN IF {_granted(table)} THEN RETURN OLD; END IF; END IF; "
            f"RAISE EXCEPTION '{message}'; END; $$ LANGUAGE plpgsql",
        ]
    if dialect in ("mysql", "mariadb"):
        return [
            f"DROP TRIGGER IF EXISTS {table}_no_delete",
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} FOR EACH ROW BEGIN "
            f"IF NOT {_granted(table)} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'; END IF; END",
        ]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")


def plain_delete_ddl(dialect: str, table: str) -> list[str]:
    """Statements that restore the DELETE guard without a door (the downgrade of 0014)."""
    message = f"{table} is append-only"
    if dialect == "sqlite":
        return [f"DROP TRIGGER IF EXISTS {table}_no_delete",
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"]
    if dialect == "postgresql":
        return [f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ "
                f"BEGIN RAISE EXCEPTION '{message}'; END; $$ LANGUAGE plpgsql"]
    if dialect in ("mysql", "mariadb"):
        return [f"DROP TRIGGER IF EXISTS {table}_no_delete",
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                f"FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'"]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")
