"""DDL that makes a table append-only inside the database itself (SPEC A2), per dialect."""

from __future__ import annotations

from harness.domain.chain import GENESIS_HASH

#: the primary key of each append-only table whose key is not `id` (MySQL's truncate guard references it)
_PRIMARY_KEY = {"trace_records": "seq", "blobs": "hash", "pruned_records": "seq", "redacted_records": "seq"}


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


#: the trigger (on PostgreSQL also its function) that keeps trace_records one linear chain (SPEC A3)
LINEAR_CHAIN = "trace_records_linear_chain"


def _expected_prev(dialect: str, binary: bool) -> str:
    """The hash a record at `seq` must link to: GENESIS_HASH for the first (chain_head starts at seq 0),
    else the hash of the record at seq - 1, or NULL when there is none (a gap). `binary`: the hash
    columns hold 32 bytes (0016), so the genesis is written as bytes; before 0016 they held hex."""
    if not binary:
        genesis = f"'{GENESIS_HASH}'"
    elif dialect == "postgresql":
        genesis = f"decode('{GENESIS_HASH}', 'hex')"
    else:
        genesis = f"X'{GENESIS_HASH}'"
    return f"CASE WHEN NEW.seq = 1 THEN {genesis} ELSE (SELECT hash FROM trace_records WHERE seq = NEW.seq - 1) END"


#: the refusal's text, as CONCAT arguments; SQLite's RAISE took only a literal until recent versions,
#: so its message names no seq
_REFUSAL = ("'trace_records: prev_hash of seq ', NEW.seq, ' does not match the hash of seq ', NEW.seq - 1, "
            "' (fork or gap refused)'")


def linear_chain_ddl(dialect: str, *, binary: bool = True) -> list[str]:
    """Statements that make an INSERT into trace_records fail, as an integrity error, unless the record
    links to the one before it: its prev_hash equals the hash of the record at seq - 1 (GENESIS_HASH at
    seq 1). With seq the primary key, two records can never share a prev_hash (no forks, SPEC A3), and no
    insert leaves a gap or a wrong link. The check probes the primary key at the table's right edge, where
    the insert writes anyway, instead of a UNIQUE index on random hashes.

    Chainers serialise on the chain_head row lock and run at READ COMMITTED (SQLite: its write lock), so
    the lookup, a statement that starts after the lock was granted, sees the previous chainer's records;
    a BEFORE ROW trigger also sees the rows the same multi-row INSERT wrote before this one.
    `binary`: the hash columns hold 32 bytes (from 0016 on) rather than hex (0007's form).
    """
    expected = _expected_prev(dialect, binary)
    if dialect == "sqlite":
        return [
            f"CREATE TRIGGER {LINEAR_CHAIN} BEFORE INSERT ON trace_records "
            f"WHEN NEW.prev_hash IS NOT ({expected}) "
            "BEGIN SELECT RAISE(ABORT, 'trace_records: prev_hash does not match the hash of the record at "
            "seq - 1 (fork or gap refused)'); END",
        ]
    if dialect == "postgresql":
        return [
            f"CREATE OR REPLACE FUNCTION {LINEAR_CHAIN}() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.prev_hash IS DISTINCT FROM ({expected}) THEN "
            f"RAISE EXCEPTION USING ERRCODE = 'integrity_constraint_violation', MESSAGE = concat({_REFUSAL}); "
            "END IF; RETURN NEW; END; $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {LINEAR_CHAIN} BEFORE INSERT ON trace_records "
            f"FOR EACH ROW EXECUTE FUNCTION {LINEAR_CHAIN}()",
        ]
    if dialect in ("mysql", "mariadb"):
        # SIGNAL takes a literal or a variable as MESSAGE_TEXT, not an expression. PyMySQL and mysqlclient
        # choose the exception class by error number, not SQLSTATE: the number of a failed reference
        # (ER_NO_REFERENCED_ROW_2, 1452) makes the refusal an IntegrityError as on the other databases
        return [
            f"CREATE TRIGGER {LINEAR_CHAIN} BEFORE INSERT ON trace_records FOR EACH ROW BEGIN "
            "DECLARE refusal VARCHAR(160); "
            f"IF NOT (NEW.prev_hash <=> ({expected})) THEN "
            f"SET refusal = CONCAT({_REFUSAL}); "
            "SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 1452, MESSAGE_TEXT = refusal; "
            "END IF; END",
        ]
    raise NotImplementedError(f"no linear-chain trigger for dialect {dialect}")


def drop_linear_chain_ddl(dialect: str) -> list[str]:
    """Statements that undo linear_chain_ddl (a migration downgrade)."""
    if dialect in ("sqlite", "mysql", "mariadb"):
        return [f"DROP TRIGGER IF EXISTS {LINEAR_CHAIN}"]
    if dialect == "postgresql":
        return [f"DROP FUNCTION IF EXISTS {LINEAR_CHAIN}() CASCADE"]
    raise NotImplementedError(f"no linear-chain trigger for dialect {dialect}")
