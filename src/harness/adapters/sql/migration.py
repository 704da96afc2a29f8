"""The schema's versions, and migration on first use (SPEC D1, D3).

Alembic loads only where a schema is migrated: a process whose database is current reads its version
from the version files and the database (`shipped_head`, `_is_current`) and never imports it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from harness.domain.errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def _alembic_config(connection: sa.Connection | None = None) -> Config:
    from alembic.config import Config  # alembic loads only when a schema is migrated

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    """The newest migration this version of harness ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


_REVISION_LINE = re.compile(r'^(down_revision|revision) = (None|"[^"]*")$', re.M)


def shipped_revisions() -> frozenset[str] | None:
    """Every migration this version of harness ships, read from the version files without alembic; None
    when the files are not one plain line of revisions (alembic is asked instead)."""
    line = _shipped_line()
    return None if line is None else line[0]


def shipped_head() -> str | None:
    """The newest migration as the version files say it, read without alembic (which costs every process
    ~10 MB and a fraction of a second to load): None when the files are not one plain line of revisions
    (a merge, a branch, a value written another way), and alembic is asked instead."""
    line = _shipped_line()
    return None if line is None else line[1]


@cache
def _shipped_line() -> tuple[frozenset[str], str] | None:
    revisions, parents = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = dict(_REVISION_LINE.findall(path.read_text(encoding="utf-8")))
        if "revision" not in found or "down_revision" not in found:
            return None
        revisions.add(found["revision"].strip('"'))
        parents.add(found["down_revision"].strip('"'))
    heads = revisions - parents
    return (frozenset(revisions), heads.pop()) if len(heads) == 1 else None


def _known_revisions() -> frozenset[str]:
    shipped = shipped_revisions()
    if shipped is not None:
        return shipped
    from alembic.script import ScriptDirectory

    return frozenset(s.revision for s in ScriptDirectory.from_config(_alembic_config()).walk_revisions())


def refuse_unknown_schema(conn: sa.Connection) -> None:
    """StoreError when the database's schema is at a revision this version of harness does not ship: a newer
    harness-kernel migrated it. Upgrading it from there cannot work, and running on a schema this code was
    not written for could damage Runs, so nothing is done and the error says what to run instead."""
    unknown = [r for r in _current_revisions(conn) if r not in _known_revisions()]
    if unknown:
        newest = shipped_head() or head_revision()
        raise StoreError(
            f"the database's schema is at revision {', '.join(unknown)}, which this version of harness-kernel "
            f"does not know (its newest is {newest}): a newer harness-kernel has migrated this database. Run "
            "that version (or a later one) against it; nothing was changed")


def _current_revisions(conn: sa.Connection) -> list[str]:
    """The revisions the database's alembic_version table holds (none: a new database)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return []
    return [row[0] for row in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]


def _is_current(conn: sa.Connection) -> bool:
    """Whether the schema is at the newest migration, checked without alembic when the files allow it."""
    head = shipped_head()
    if head is not None:
        return _current_revisions(conn) == [head]
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision() == head_revision()


#: key of the advisory lock that lets one process at a time migrate a database
_MIGRATION_LOCK = 0x6861726E  # "harn"
#: MySQL's named locks are server-wide: one per database (a name may have at most 64 characters)
_MYSQL_LOCK_NAME = "CONCAT('harness_migrate_', MD5(DATABASE()))"


def migrate(engine: sa.Engine) -> None:
    """Bring the schema up to the newest migration; a no-op when it already is.

    Workers that start together on a new database take turns through a database lock (SQLite's write
    lock, PostgreSQL's advisory lock, MySQL's named lock); each re-reads the version once it holds it,
    so one migrates and the others find the schema current. A schema a newer harness-kernel migrated is
    refused with StoreError (`refuse_unknown_schema`), before anything is written.
    """
    with engine.connect() as conn:
        if _is_current(conn):
            return
        refuse_unknown_schema(conn)
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    head = shipped_head() or head_revision()  # alembic's upgrade loads the version files once more itself
    with engine.begin() as conn:
        dialect = conn.dialect.name
        if dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        elif dialect in ("mysql", "mariadb"):
            conn.execute(sa.text(f"SELECT GET_LOCK({_MYSQL_LOCK_NAME}, 600)"))
        try:
            if MigrationContext.configure(conn).get_current_revision() != head:
                refuse_unknown_schema(conn)  # another process may have migrated it meanwhile, with a newer version
                command.upgrade(_alembic_config(conn), "head")
        finally:
            if dialect in ("mysql", "mariadb"):  # a session lock: MySQL's DDL commits as it goes
                conn.execute(sa.text(f"SELECT RELEASE_LOCK({_MYSQL_LOCK_NAME})"))
