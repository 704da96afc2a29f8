"""DDL that makes a table append-only inside the database itself (SPEC A2), per dialect."""

from __future__ import annotations

#: the primary key of each append-only table whose key is not `id` (MySQL's truncate guard references it)
_PRIMARY_KEY = {"trace_records": "seq", "blobs": "hash"}


def append_only_ddl(dialect: str, table: str) -> list[str]:
    """Statements that make UPDATE, DELETE and TRUNCATE (where it exists) on `table` fail."""
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
        # MySQL fires no trigger on TRUNCATE, but InnoDB refuses to truncate a table that a foreign
        # key of another table references: an empty guard table holds such a key.
        key, guard = _PRIMARY_KEY.get(table, "id"), f"{table}_truncate_guard"
        return [
            *(f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
              f"FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'"
              for verb in ("UPDATE", "DELETE")),
            f"CREATE TABLE {guard} AS SELECT {key} AS ref FROM {table} WHERE 1 = 0",
            f"ALTER TABLE {guard} ADD CONSTRAINT fk_{guard} FOREIGN KEY (ref) REFERENCES {table} ({key})",
        ]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")


def drop_append_only_ddl(dialect: str, table: str) -> list[str]:
    """Statements that undo append_only_ddl, to run before `table` is dropped (a migration downgrade)."""
    if dialect == "sqlite":
        return [f"DROP TRIGGER IF EXISTS {table}_no_{verb}" for verb in ("update", "delete")]
    if dialect == "postgresql":
        return [f"DROP FUNCTION IF EXISTS {table}_append_only() CASCADE"]
    if dialect in ("mysql", "mariadb"):
        return [f"DROP TABLE IF EXISTS {table}_truncate_guard"]
    raise NotImplementedError(f"no append-only triggers for dialect {dialect}")
