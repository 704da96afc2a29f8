"""A tenant or user id no Run could have is refused by the commands that write under it (exit 2, the
option named), before the database is opened: nothing is stored or audited under it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app


@pytest.mark.parametrize(("command", "flag"), [
    (["kb", "add", "{file}", "--tenant", ""], "--tenant"),
    (["kb", "add", "{file}", "--tenant", "a" * 129], "--tenant"),
    (["kb", "list", "--tenant", "has space"], "--tenant"),
    (["erase", "--user", "x", "--tenant", ""], "--tenant"),
    (["erase", "--user", ""], "--user"),
    (["erase", "--user", "-starts-with-a-dash"], "--user"),
])
def test_an_impossible_id_is_refused_before_anything_is_written(command: list[str], flag: str, tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("Returns are accepted within 30 days.\n")
    db = tmp_path / "harness.db"
    args = [a.replace("{file}", str(tmp_path / "notes.md")) for a in command]
    result = CliRunner().invoke(app, [*args, "--db", str(db)], env={"HARNESS_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {flag}" in result.stderr and "is not a valid id" in result.stderr
    assert "Traceback" not in result.output
    assert not db.exists()  # refused before the database was touched


def test_a_valid_id_still_works(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("Returns are accepted within 30 days.\n")
    result = CliRunner().invoke(app, ["kb", "add", str(tmp_path / "notes.md"), "--tenant", "acme.eu:1",
                                      "--db", str(tmp_path / "harness.db"), "--json"],
                                env={"HARNESS_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 0, result.output
