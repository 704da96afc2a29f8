"""A database's schema on the three backends: a schema that a newer harness-kernel migrated is refused with a
clear error, before anything is written, by the library, the CLI and `harness serve`; a migration that fails
is named without a traceback."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import _current_revisions, migrate, shipped_head, shipped_revisions
from harness.domain.errors import StoreError

SRC = Path(__file__).resolve().parents[2] / "src"
FUTURE = "0099_from_a_newer_harness"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}


def _revisions(url: str) -> list[str]:
    engine = create_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            return _current_revisions(conn)
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(resolve_url(url))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _from_the_future(url: str) -> None:
    """A migrated database whose alembic_version a newer harness-kernel wrote."""
    engine = create_engine(resolve_url(url))
    try:
        migrate(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})
    finally:
        engine.dispose()


def test_the_version_files_are_read_alike_with_and_without_alembic() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from harness.adapters.sql.migration import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(cfg)
    assert shipped_revisions() == frozenset(s.revision for s in script.walk_revisions())
    assert shipped_head() == script.get_current_head()


def test_a_schema_a_newer_harness_migrated_is_refused_and_left_alone(empty_backend_url: str) -> None:
    _from_the_future(empty_backend_url)
    tables = _tables(empty_backend_url)
    from harness.stores import prepare_schema

    engine = create_engine(resolve_url(empty_backend_url))
    try:
        for bring_up in (functools.partial(migrate, engine), functools.partial(prepare_schema, empty_backend_url)):
            with pytest.raises(StoreError) as refused:
                bring_up()
            message = str(refused.value)
            assert FUTURE in message and str(shipped_head()) in message, message
            assert "newer harness-kernel" in message and "nothing was changed" in message, message
    finally:
        engine.dispose()
    assert _revisions(empty_backend_url) == [FUTURE]
    assert _tables(empty_backend_url) == tables


def test_a_migration_that_fails_is_named_without_a_traceback(tmp_path: Path) -> None:
    """A file holding a `runs` table of someone else's, and no schema version: the first migration cannot
    create its own, and the command says what it met (exit 2)."""
    path = tmp_path / "taken.db"
    engine = create_engine(resolve_url(str(path)))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE runs (something TEXT)"))
    finally:
        engine.dispose()
    done = subprocess.run([sys.executable, "-m", "harness.cli", "--db", str(path), "audit", "verify"], env=_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert "error: database error" in done.stderr and "table runs already exists" in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["audit", "verify"], ["serve", "--port", "0"], ["worker"]])
def test_the_cli_refuses_a_newer_schema_without_a_traceback(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "newer.db"
    _from_the_future(str(path))
    done = subprocess.run([sys.executable, "-m", "harness.cli", "--db", str(path), *command], env=_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"error: StoreError: the database's schema is at revision {FUTURE}" in done.stderr, done.stderr
    assert _revisions(str(path)) == [FUTURE]
