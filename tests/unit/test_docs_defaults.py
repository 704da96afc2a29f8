"""The documented defaults are the code's: every settings table in the README and the docs states, for each
variable with a plain default, the value the settings classes hold, and the data directory, the example's
ledger and what git ignores say one thing everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.audit.keys import KEY_DIR_ENV
from harness.paths import default_data_dir
from harness.service.settings import _ENV as SERVICE_ENV
from harness.service.settings import ServiceSettings
from harness.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: each documented settings table and the column of its defaults
TABLES = (("README.md", -1), ("docs/reference.md", 1), ("docs/service.md", -1))


def _rows(path: str, column: int) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
        found = re.match(r"\| `(HARNESS_[A-Z0-9_]+)`(?:, `HARNESS_[A-Z0-9_]+`)* \|", line)
        if found:
            rows[found.group(1)] = [c.strip() for c in line.strip().strip("|").split(" | ")][column]
    return rows


def _plain_defaults() -> dict[str, str]:
    """The variables whose default is a plain value, as the docs write it."""
    fields = {f"HARNESS_{name.upper()}": field for name, field in Settings.model_fields.items()}
    fields |= {env: ServiceSettings.model_fields[name] for name, env in SERVICE_ENV.items()}
    plain: dict[str, str] = {}
    for env, field in fields.items():
        value = field.get_default(call_default_factory=False)
        if isinstance(value, bool):
            continue  # written as true/false/0/1 by taste
        if isinstance(value, float):
            plain[env] = f"{value:g}"
        elif isinstance(value, int | str) and not isinstance(value, bool) and value != "":
            plain[env] = str(value)
    return plain


@pytest.mark.parametrize(("path", "column"), TABLES)
def test_documented_plain_defaults_are_the_settings(path: str, column: int) -> None:
    """A settings table's default cell names the default the settings class holds."""
    rows, plain = _rows(path, column), _plain_defaults()
    wrong = {env: (cell, plain[env]) for env, cell in rows.items()
             if env in plain and not re.search(rf"(?<![\w.]){re.escape(plain[env])}(?![\w.])", cell)}
    assert not wrong, f"{path}: documented default (cell, actual): {wrong}"


def test_data_directory_and_example_ledger_say_one_thing() -> None:
    """The data directory defaults to ~/.local/share/harness everywhere, the example's ledger lives in the
    database's own folder of it, and no file ignores a data folder in the checkout."""
    assert default_data_dir().name == "harness"
    for path, column in TABLES[:2]:
        assert "~/.local/share/harness" in _rows(path, column)["HARNESS_DATA_DIR"], path
    assert "<database id>/support-ledger.jsonl" in _rows("docs/reference.md", 1)["HARNESS_EXAMPLE_LEDGER"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "~/.local/share/harness/<database id>/" in readme
    assert "harness-data" not in (ROOT / ".gitignore").read_text(encoding="utf-8")
    for doc in ("README.md", "docs/reference.md"):
        assert "harness-data" not in (ROOT / doc).read_text(encoding="utf-8"), doc


def test_checkpoint_key_folder_is_documented_alike() -> None:
    """The signing key folder's default is the same path in both settings tables."""
    for path, column in TABLES[:2]:
        assert "~/.config/harness/keys" in _rows(path, column)[KEY_DIR_ENV], path


def test_ci_names_no_path_of_one_machine() -> None:
    """`.ci/run` installs from pip's own settings: no folder of one machine is named in it."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert not re.search(r"(?<![\w.])/(work|home|Users|srv|opt|mnt)/", script), "a machine's own path in .ci/run"
