"""Settings live in harness.settings, below the composition root, and stay importable from where they were."""

from __future__ import annotations

import subprocess
import sys

import harness
import harness.config
import harness.settings


def test_settings_are_one_class_wherever_they_are_imported_from() -> None:
    """`harness.config.Settings` and `harness.Settings` are the class harness.settings defines."""
    assert harness.config.Settings is harness.settings.Settings
    assert harness.Settings is harness.settings.Settings
    assert harness.config.parse_port_range is harness.settings.parse_port_range


def test_reading_settings_loads_no_adapter() -> None:
    """Settings can be read from the environment without loading SQLAlchemy or any adapter."""
    code = ("import sys, harness.settings as s; s.Settings.from_env(); "
            "loaded = [m for m in sys.modules if m == 'sqlalchemy' or m.startswith(('harness.adapters', "
            "'harness.config'))]; print(loaded); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
