"""A sandboxed skill runs only the code it was pinned to (SPEC T1, T4): its file is not imported where
the Run is driven, so the sandbox itself checks the file against the pinned hash before running it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.clock import FakeClock

from .test_sandbox import Mode, need_bwrap, sandbox_runtime, tool_and_errors

TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.mark.parametrize("mode", ["rlimit", "bwrap"])
def test_a_sandboxed_skill_edited_after_loading_is_refused_inside_the_sandbox(tmp_path: Path, clock: FakeClock,
                                                                             mode: Mode) -> None:
    """The skills are loaded, then the sandboxed skill's file is edited: the call fails manifest_changed
    and none of the edited code runs (its marker file never appears); the unedited file runs as before."""
    if mode == "bwrap":
        need_bwrap()
    rt = sandbox_runtime(tmp_path, clock, mode, {"note it": ("test.sbx_note", {"text": "x"})})
    try:
        done = rt.runs.create_run({"task": "note it", **TESTER})
        assert done.state == "SUCCEEDED", done.error
        code = tmp_path / "skills" / "sbx.py"
        marker = tmp_path / "data" / "edited-code-ran"
        code.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + code.read_text())
        refused = rt.runs.create_run({"task": "note it", **TESTER})
        assert refused.state == "CLOSED_FAILED" and "manifest_changed" in (refused.error or ""), refused.error
        tools, _ = tool_and_errors(rt, refused.run_id)
        assert [t["error_code"] for t in tools] == ["manifest_changed"]
        assert not marker.exists()
    finally:
        rt.close()
