"""The README's audit commands work as written, in the README's own flow: after `harness demo` and a
`harness serve` that already published checkpoints of its own, `harness-verify` given the checkpoint folder
checks an export and an archive segment against the checkpoint each was made against."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_line(starts: str) -> str:
    """The README's command line that starts with `starts`, its comment cut."""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith(starts):
            return line.split("  #", 1)[0].strip()
    raise AssertionError(f"the README has no command starting {starts!r}")


def sh(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A README command line run by the shell (globs expanded), `harness` and `harness-verify` being this
    interpreter's."""
    line = re.sub(r"^harness-verify\b", f"{shlex.quote(sys.executable)} -m harness.audit.standalone", line)
    line = re.sub(r"^harness\b", f"{shlex.quote(sys.executable)} -m harness.cli", line)
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("HARNESS_DATABASE_URL", "HARNESS_CHECKPOINT_DIR", "HARNESS_ARCHIVE_URL")})


@pytest.fixture
def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """(folder, run id): a new folder where the demo ran, the service published a checkpoint before anyone
    else did, and then a Run succeeded."""
    monkeypatch.setenv("HARNESS_MEMORY", "off")
    assert sh("harness demo", tmp_path).returncode == 0
    assert sh("harness audit checkpoint", tmp_path).returncode == 0  # what `harness serve` does on its own
    ran = sh("harness run 'Where is order A-1002?' --json", tmp_path)
    assert ran.returncode == 0, ran.stderr
    return tmp_path, json.loads(ran.stdout)["run_id"]


def test_the_readme_export_and_segment_lines_verify(flow: tuple[Path, str]) -> None:
    """The README's `audit checkpoint`, `audit export`, `harness-verify export`, `archive` and `harness-verify
    segment` lines, run in that order, all succeed and both verifications say VALID."""
    folder, run_id = flow
    assert sh(readme_line("harness audit checkpoint"), folder).returncode == 0
    export = sh(readme_line("harness audit export").replace("<run_id>", run_id), folder)
    assert export.returncode == 0, export.stderr
    verified = sh(readme_line("harness-verify export"), folder)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "export: VALID" in verified.stdout
    archived = sh(readme_line("harness archive").replace("--older-than-days 30", "--older-than-days 0"), folder)
    assert archived.returncode == 0, archived.stderr
    assert sh("harness audit checkpoint", folder).returncode == 0  # the service's next one
    segment = sh(readme_line("harness-verify segment").replace("<run_id>", run_id), folder)
    assert segment.returncode == 0, segment.stdout + segment.stderr
    assert "segment: VALID" in segment.stdout


def test_an_export_checked_against_an_older_checkpoint_file_is_invalid(flow: tuple[Path, str]) -> None:
    """Why the folder form exists: the first checkpoint file, named by hand, is not the one a later export
    was made against; the database's own folder picks the right one."""
    folder, run_id = flow
    assert sh("harness audit checkpoint", folder).returncode == 0
    assert sh(f"harness audit export {run_id} -o run.json", folder).returncode == 0
    first = sh("harness-verify export run.json --checkpoint harness-checkpoints/*/checkpoint-00000001.json", folder)
    assert first.returncode == 1 and "INVALID" in first.stdout
    picked = sh("harness-verify export run.json --checkpoint harness-checkpoints/*/", folder)
    assert picked.returncode == 0, picked.stdout + picked.stderr
