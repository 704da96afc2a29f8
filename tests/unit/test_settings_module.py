"""Settings live in harness.settings, below the composition root, and nowhere else."""

from __future__ import annotations

import subprocess
import sys

import pytest

import harness
import harness.settings
from harness.settings import Settings


def test_the_public_settings_are_the_class_harness_settings_defines() -> None:
    """`harness.Settings` is the class harness.settings defines (the composition root no longer offers it:
    tests/unit/test_architecture.py keeps every name in one home)."""
    assert harness.Settings is harness.settings.Settings


def test_reading_settings_loads_no_adapter() -> None:
    """Settings can be read from the environment without loading SQLAlchemy or any adapter."""
    code = ("import sys, harness.settings as s; s.Settings.from_env(); "
            "loaded = [m for m in sys.modules if m == 'sqlalchemy' or m.startswith(('harness.adapters', "
            "'harness.config'))]; print(loaded); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_drives_run_on_one_thread_on_sqlite_and_four_on_a_database_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's round trip holds a drive loop's thread, so a server database gets four loops; SQLite
    has no round trip and one. HARNESS_DRIVE_THREADS sets it; the Runs in flight stay HARNESS_DRIVE_CONCURRENCY."""
    for key in ("HARNESS_DB", "HARNESS_DRIVE_THREADS", "HARNESS_DRIVE_CONCURRENCY", "HARNESS_CONFIG_FILE"):
        monkeypatch.delenv(key, raising=False)
    assert Settings.from_env().drive_loop_threads() == 1
    for db, threads in (("/tmp/x.db", 1), ("sqlite:////tmp/x.db", 1), ("postgresql+psycopg://u@h/db", 4),
                        ("mysql+pymysql://u@h/db", 4)):
        assert Settings.from_env(db=db).drive_loop_threads() == threads, db
    monkeypatch.setenv("HARNESS_DRIVE_THREADS", "2")
    monkeypatch.setenv("HARNESS_DRIVE_CONCURRENCY", "300")
    tuned = Settings.from_env(db="postgresql+psycopg://u@h/db")
    assert (tuned.drive_loop_threads(), tuned.drive_concurrency) == (2, 300)
