"""The migrations form one line: one head, every revision reachable from it (SPEC D3)."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

from harness.adapters.sql.migration import MIGRATIONS_DIR, head_revision, shipped_head


def test_the_migrations_have_exactly_one_head() -> None:
    """Two branches that each added a migration on the same parent must be re-chained, or an upgrade to
    "head" fails on every database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(config)
    assert len(script.get_heads()) == 1, script.get_heads()
    assert script.get_bases() == ["0001_kernel"]


def test_the_head_read_without_alembic_is_alembics_head() -> None:
    """Every process checks its schema against the head read from the version files without alembic, so
    that reading must agree with alembic's, or a current database would be migrated (or a stale one not)."""
    assert shipped_head() is not None
    assert shipped_head() == head_revision()
