"""Engines for every supported database, and schema migration on first use (SPEC D1, D3, K4)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from harness.errors import InvalidRequestError

DEFAULT_SQLITE_FILE = "harness.db"
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def resolve_url(db: str | None) -> str:
    """Turn `--db` / HARNESS_DATABASE_URL into a SQLAlchemy URL; a plain path means SQLite."""
    value = db or os.environ.get("HARNESS_DATABASE_URL") or DEFAULT_SQLITE_FILE
    if "://" in value:
        try:
            sa.engine.make_url(value)
        except sa.exc.ArgumentError as exc:
            raise InvalidRequestError(f"database URL {value!r} is not valid: {exc}") from exc
        return value
    path = Path(value).expanduser().resolve()
    if path.is_dir():
        raise InvalidRequestError(f"database path {str(path)!r} is a directory, not a file")
    if not path.parent.exists():
        raise InvalidRequestError(f"database folder {str(path.parent)!r} does not exist")
    return f"sqlite:///{path}"


def create_engine(url: str, *, sqlite_synchronous: str | None = None) -> sa.Engine:
    """An engine configured so that concurrent writers serialize safely on every backend."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() == "sqlite":
        return _sqlite_engine(url, sqlite_synchronous or os.environ.get("HARNESS_SQLITE_SYNCHRONOUS", "NORMAL"))
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "future": True}
    if u.get_backend_name() in ("mysql", "mariadb"):
        kwargs["isolation_level"] = "READ COMMITTED"
    return sa.create_engine(url, **kwargs)


def _sqlite_engine(url: str, synchronous: str) -> sa.Engine:
    if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise InvalidRequestError(f"HARNESS_SQLITE_SYNCHRONOUS must be NORMAL, FULL or EXTRA, not {synchronous!r}")
    engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED, which turns
        # concurrent writers into "database is locked" errors instead of waiting (SPEC K4).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _alembic_config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    """The newest migration this version of harness ships."""
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def migrate(engine: sa.Engine) -> None:
    """Bring the schema up to the newest migration; a no-op when it already is."""
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current == head_revision():
        return
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "head")
