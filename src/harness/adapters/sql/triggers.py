"""DDL that makes a table append-only inside the database itself (SPEC A2), per dialect."""

from __future__ import annotations


def append_only_ddl(dialect: str, table: str) -> list[str]:
    """Statements that make UPDATE and DELETE (and TRUNCATE where it exists) on `table` fail."""
    message = f"{table} is append-only"
    if dialect == "sqlite":
        return [
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
            for verb in ("UPDATE", "DELETE")
        ]
    if dialect == "postgresql":
        return [
            f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ "
            f"BEGIN RAISE EXCEPTION '{message}'; END; $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {table}_no_change BEFORE UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {table}_append_only()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {table}_append_only()",
        ]
    if dialect in ("mysql", "mariadb"):
        return [
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'"
            for verb in ("UPDATE", "DELETE")
        ]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")
