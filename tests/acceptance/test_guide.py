"""The "write your own agent" guide works as written: its files are written out and its program run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-your-own-agent.md"
BLOCK = re.compile(r"^```(\w+)(?: ([\w./-]+))?\n(.*?)^```$", re.S | re.M)


def _blocks() -> list[tuple[str, str | None, str]]:
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(GUIDE.read_text(encoding="utf-8"))]


def test_the_guides_program_runs_and_prints_what_the_guide_says(tmp_path: Path) -> None:
    """Every file the guide names is written as shown; main.py runs to the end (its own asserts hold:
    a chat turn succeeds, a two-round Run parks for a lead, the requester cannot approve it, the lead
    can, and both rounds passed policy) and prints the output the guide shows."""
    files = [(path, body) for _, path, body in _blocks() if path]
    assert [p for p, _ in files][-1] == "main.py"
    for path, body in files:
        (tmp_path / path).write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (shown,) = [body for lang, path, body in _blocks() if lang == "text" and path is None]
    assert done.stdout == shown


def test_the_guide_names_only_settings_that_exist() -> None:
    """Every HARNESS_* variable the guide mentions is one the reference page documents."""
    reference = (GUIDE.parent / "reference.md").read_text(encoding="utf-8")
    for name in set(re.findall(r"HARNESS_[A-Z_]+", GUIDE.read_text(encoding="utf-8"))):
        assert f"`{name}`" in reference, name
