"""What a sandboxed call leaves besides its output (seed 004 §4.3), on SQLite, PostgreSQL and MariaDB: what
it printed, bounded and filtered for secrets, and the files it wrote in its working directory, kept by
content hash with the Run's other contents (so an erasure of its person deletes them) and listed in the
result; a file over the bounds, or that is not a plain file of the directory, is listed as not kept with
the reason."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from harness.adapters.sql.blobs import blob_refs
from harness.cli.documents import run_document
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.pipeline.artifacts import stored_bytes
from harness.ports import Clock
from harness.replay.runner import replay
from harness.settings import Settings
from harness.wiring.retention import erase_user, segment_locator
from tests.conftest import FIXTURES
from tests.integration.test_sandbox import need_bwrap

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
#: printed on stdout, printed on stderr, and written into a text file: none may be kept as it is
PRINTED = "ghp_PrintedBySandboxSkill0123456789abcdef"
WARNED = "AKIAZ7Q2SANDBOXSTDERR9"
IN_FILE = "ghp_WrittenToAFileBySkill0123456789abcd"
PNG = bytes(range(256)) * 4  # not text: kept byte for byte

SKILL = f'''
import os, sys
from pathlib import Path

def report(args, ctx):
    work = Path(ctx.workdir)
    print("token {PRINTED}")
    print("key {WARNED}", file=sys.stderr)
    print("x" * args["noise"])
    (work / "out").mkdir(exist_ok=True)
    (work / "out" / "report.csv").write_text("order,total\\nA-1,42\\n# key: {IN_FILE}\\n")
    (work / "chart.png").write_bytes(bytes(range(256)) * 4)
    (work / "big.bin").write_bytes(b"x" * 8192)
    (work / "z_extra.txt").write_text("one too many")
    os.symlink("/etc/hostname", work / "host-link")
    return {{"rows": 1}}
'''


def sandbox_runtime(tmp_path: Path, db: str, clock: Clock | None = None, **settings: Any) -> Runtime:
    """The test skills plus one sandboxed `test.report`, planned by the task "report"."""
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "report.py").write_text(textwrap.dedent(SKILL))
    (skills / "report.yaml").write_text(yaml.safe_dump({
        "id": "test.report", "version": "1.0.0", "entrypoint": "report.py:report", "sandbox": True,
        "input_schema": {"type": "object"}, "risk": {"access": "read"}, "timeout_s": 20}))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"rules": [{"name": "report", "when": "^report", "plan": {"steps": [
        {"id": "a", "tool_call": {"skill": "test.report", "arguments": {"noise": 40_000}}, "output_key": "a"}]}}]}))
    values: dict[str, Any] = {"artifact_max_bytes": 4096, "artifact_max_count": 2, "sandbox_stream_bytes": 2048,
                              "identities_file": FIXTURES / "identities.yaml", **settings}
    return build_runtime(Settings(db=db, skills_dirs=(skills,), policy_file=FIXTURES / "policy.yaml",
                                  llm_rules=rules, data_dir=tmp_path / "data", **{"sandbox": "bwrap", **values}),
                         clock=clock or FakeClock())


@pytest.fixture
def runtime(tmp_path: Path, backend_url: str) -> Iterator[Runtime]:
    need_bwrap()
    rt = sandbox_runtime(tmp_path, backend_url)
    yield rt
    rt.close()


def test_a_sandboxed_skills_files_and_streams_are_kept_bounded_and_filtered(runtime: Runtime) -> None:
    """The Run's result lists the files the call wrote (name, size, media type, SHA-256), within the count
    and size bounds; their contents are stored by hash as the Run's, read back byte for byte (a text file
    with its secret removed); the streams keep their start and end and no secret; the skipped files say why;
    the ToolTrace names the kept contents; and once the person is erased, the contents are gone."""
    result = runtime.runs.create_run({"task": "report", **TESS})
    assert result.state == "SUCCEEDED", result.error
    assert [(f.name, f.media_type) for f in result.files] == [("chart.png", "image/png"),
                                                                ("out/report.csv", "text/csv")]
    chart, report = result.files
    assert (chart.size, chart.filtered, report.filtered) == (len(PNG), False, True)
    assert stored_bytes(runtime.contents, chart) == PNG
    csv = stored_bytes(runtime.contents, report)
    assert csv is not None and csv.startswith(b"order,total\nA-1,42\n") and IN_FILE.encode() not in csv
    assert len(csv) == report.size
    shown = run_document(runtime.store, result.run_id)["files"]  # `harness runs show --json`
    assert [f["sha256"] for f in shown] == [chart.sha256, report.sha256]

    outcome = (runtime.store.get_run(result.run_id).context or {})["steps"]["a"]
    stdout, stderr = outcome["stdout"], outcome["stderr"]
    assert stdout.startswith("token ") and "bytes left out" in stdout and len(stdout) < 2300
    assert PRINTED not in stdout and WARNED not in stderr and stderr.startswith("key ")
    skipped = {s["name"]: s["reason"] for s in outcome["skipped_files"]}
    assert set(skipped) == {"big.bin", "z_extra.txt"}  # the symlink is not a file of the directory
    assert "HARNESS_ARTIFACT_MAX_BYTES" in skipped["big.bin"]
    assert "HARNESS_ARTIFACT_MAX_COUNT" in skipped["z_extra.txt"]

    runtime.store.drain_all()
    report_of_replay = replay(result.run_id, runtime.store, runtime.settings)  # no sandbox runs in it
    assert report_of_replay.ok, report_of_replay.divergences
    (tool,) = [r.data() for r in runtime.store.trace_of(result.run_id) if r.kind == "tool"]
    assert tool["isolation"] == "bwrap" and tool["files"] == [chart.content_hash, report.content_hash]
    with runtime.store.engine.connect() as conn:
        refs = set(conn.execute(sa.select(blob_refs.c.hash).where(blob_refs.c.run_id == result.run_id)).scalars())
    assert {chart.content_hash, report.content_hash} <= refs

    erase_user(runtime.store, "t1", "tess", vacuum=False)
    assert stored_bytes(runtime.contents, chart) is None and stored_bytes(runtime.contents, report) is None


def kept_in_a_file_store(rt: Runtime, location: str, listed: Callable[[], list[str]]) -> None:
    """The scenario of a file store: a Run's kept files are objects there (one per file, named for it), the
    database holds only where they are, they read back byte for byte through the API's reader, and an
    erasure of the person deletes them."""
    result = rt.runs.create_run({"task": "report", **TESS})
    assert result.state == "SUCCEEDED", result.error
    chart, report = result.files
    assert sorted(name.split(".")[0] for name in listed()) == sorted([chart.sha256, report.sha256])
    stored = rt.contents.raw([chart.content_hash])[chart.content_hash]
    assert '"location":"' + location in stored and "base64" not in stored
    assert stored_bytes(rt.contents, chart, segment_locator()) == PNG
    assert stored_bytes(rt.contents, chart) is None  # without the store the bytes cannot be had
    assert erase_user(rt.store, "t1", "tess", vacuum=False).files == 2
    assert listed() == []
    assert stored_bytes(rt.contents, chart, segment_locator()) is None


def test_a_directory_file_store_holds_the_files_and_an_erasure_deletes_them(tmp_path: Path, backend_url: str) -> None:
    """HARNESS_ARTIFACT_STORE a directory: the kept files' bytes are files there; the erasure finds them
    through the Run's stored contents (on each backend) and deletes them."""
    need_bwrap()
    folder = tmp_path / "files"
    rt = sandbox_runtime(tmp_path, backend_url, artifact_store=str(folder))
    try:
        kept_in_a_file_store(rt, folder.resolve().as_uri(), lambda: sorted(p.name for p in folder.glob("*")))
    finally:
        rt.close()


def test_an_s3_bucket_holds_the_files_and_an_erasure_deletes_them(tmp_path: Path, s3_endpoint: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_ARTIFACT_STORE s3://bucket/prefix (an S3-compatible server on loopback): the same, in the
    bucket."""
    need_bwrap()
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setenv("HARNESS_ARCHIVE_S3_ENDPOINT", s3_endpoint)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)

    def listed() -> list[str]:
        found = s3.list_objects_v2(Bucket="runs-archive", Prefix="kept/").get("Contents", [])
        return sorted(o["Key"].removeprefix("kept/") for o in found)

    rt = sandbox_runtime(tmp_path, str(tmp_path / "s3.db"), artifact_store="s3://runs-archive/kept")
    try:
        kept_in_a_file_store(rt, "s3://runs-archive/kept/", listed)
    finally:
        rt.close()


def test_the_rlimit_fallback_leaves_the_same_streams_and_files(tmp_path: Path) -> None:
    """Under the weaker rlimit sandbox the call's streams and files are collected the same way."""
    rt = sandbox_runtime(tmp_path, str(tmp_path / "rlimit.db"), sandbox="rlimit")
    try:
        result = rt.runs.create_run({"task": "report", **TESS})
        assert result.state == "SUCCEEDED", result.error
        assert [f.name for f in result.files] == ["chart.png", "out/report.csv"]
        outcome = (rt.store.get_run(result.run_id).context or {})["steps"]["a"]
        assert outcome["stdout"].startswith("token ") and PRINTED not in outcome["stdout"]
        assert stored_bytes(rt.contents, result.files[0]) == PNG
    finally:
        rt.close()
