"""What travels with a remote sandbox call, against a real sandbox server (in this process, on loopback)
over this host's bubblewrap: the skill's code is sent once and kept by its digest; the Run's files go
there and the call's changes come back; a server that lost the code or the files (a restart on new
storage) is sent them again and the call succeeds; too much to carry fails the call naming the bound; a
request naming a path outside the Run's folder is refused and writes nothing."""

from __future__ import annotations

import base64
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.adapters.sandbox import select_sandbox, shipping
from harness.adapters.sandbox.remote import RemoteSandbox
from harness.adapters.sandbox.server import make_server
from harness.adapters.sandbox.yard import Yard
from harness.domain.sandbox import SandboxJob
from tests.integration.test_sandbox import need_bwrap

TOKEN = "a-token-of-twenty-four-chars"
COUNTER = '''
from pathlib import Path

def count(args, ctx):
    """Add one to the count kept in the working directory; write a note beside it; remove the old note."""
    work = Path(ctx.workdir)
    path = work / "count.txt"
    value = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(value))
    (work / "notes").mkdir(exist_ok=True)
    (work / "notes" / f"{value}.txt").write_text(f"call {value}")
    old = work / "notes" / f"{value - 1}.txt"
    if old.exists():
        old.unlink()
    return {"count": value, "where": str(ctx.workdir)}
'''


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RemoteSandbox, Yard, Path]]:
    """(a client, the server's yard, the skill's folder here)."""
    need_bwrap()
    yard = Yard(tmp_path / "server")
    server = make_server(select_sandbox("bwrap"), TOKEN, "127.0.0.1", 0, yard)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    skill = tmp_path / "skill"
    skill.mkdir()
    (skill / "counter.py").write_text(COUNTER)
    client = RemoteSandbox(f"http://127.0.0.1:{server.server_port}", TOKEN)
    yield client, yard, skill
    client.close()
    server.shutdown()
    server.server_close()


def job(skill: Path, workdir: Path, run_id: str = "run-1") -> SandboxJob:
    workdir.mkdir(parents=True, exist_ok=True)
    return SandboxJob(skill_id="test.counter", function="count", arguments={},
                      context={"run_id": run_id, "step_id": "a", "idempotency_key": "k", "tenant_id": "t",
                               "user_id": "u", "workdir": str(workdir)},
                      workdir=workdir, wall_s=20, entry_file=skill / "counter.py")


def test_the_code_goes_once_and_the_runs_files_go_both_ways(
        served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path) -> None:
    """Three calls of one Run: the count grows from the working directory the server keeps, each call's
    files (and the removal of the old note) come back here, the skill ran at the server's own paths, and
    one code archive is kept there."""
    client, yard, skill = served
    here = tmp_path / "client" / "run-1"
    for expected in (1, 2, 3):
        outcome = client.run(job(skill, here))
        assert outcome.ok, outcome
        assert outcome.output["count"] == expected
        assert outcome.output["where"] == str(yard.workdirs.path("run-1").resolve())
        assert (here / "count.txt").read_text() == str(expected)
        assert sorted(p.name for p in (here / "notes").iterdir()) == [f"{expected}.txt"]
    assert len(list((yard.root / "code").iterdir())) == 1


def test_a_server_that_lost_the_code_and_the_files_is_sent_them_again(
        served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path) -> None:
    """The server's storage is emptied between two calls (a restart on new storage): the second call is
    refused for want of the code and of the Run's files, the client sends both, and the count goes on from
    the files kept here."""
    client, yard, skill = served
    here = tmp_path / "client" / "run-1"
    assert client.run(job(skill, here)).output["count"] == 1
    shutil.rmtree(yard.root)
    outcome = client.run(job(skill, here))
    assert outcome.ok and outcome.output["count"] == 2, outcome
    assert (here / "count.txt").read_text() == "2"


def test_more_than_a_call_may_carry_fails_it_naming_the_bound(
        served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A working directory holding more than the transfer bound: the call fails sandbox_transfer_limit,
    naming the bound, and nothing runs on the server."""
    client, yard, skill = served
    monkeypatch.setattr(shipping, "MAX_TRANSFER", 4096)
    here = tmp_path / "client" / "run-1"
    here.mkdir(parents=True)
    (here / "big.bin").write_bytes(b"x" * 5000)
    outcome = client.run(job(skill, here))
    assert not outcome.ok and outcome.error_code == "sandbox_transfer_limit"
    assert "larger than 4096 bytes" in outcome.message
    assert not yard.workdirs.path("run-1").exists()


@pytest.mark.parametrize("name", ["../escaped.txt", "/etc/escaped.txt", "a/../../escaped.txt", ""])
def test_a_file_named_outside_the_runs_folder_is_refused(
        served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path, name: str) -> None:
    """A request sending a file whose name leaves the Run's folder: 400 naming the path, nothing written,
    nothing run."""
    client, yard, skill = served
    body = client._job(job(skill, tmp_path / "client" / "run-1"))
    body["files"]["send"][name] = base64.b64encode(b"escape").decode()
    answer = httpx.post(f"{client.url}/v1/run", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400, answer.text
    assert "not a path inside the working directory" in answer.json()["error"]
    assert not list(yard.root.rglob("escaped.txt")) and not (tmp_path / "escaped.txt").exists()
    assert not (yard.workdirs.path("run-1") / "count.txt").exists()


def test_code_that_is_not_its_digest_is_refused(served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path) -> None:
    """An archive whose bytes do not match the digest it is sent under: 400, nothing kept under that name."""
    client, yard, skill = served
    body = client._job(job(skill, tmp_path / "client" / "run-1"), everything=True)
    body["code"]["digest"] = "0" * 64
    answer = httpx.post(f"{client.url}/v1/run", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and "does not match its digest" in answer.json()["error"], answer.text
    assert not (yard.root / "code" / ("0" * 64)).exists()


def test_a_file_sent_through_a_link_the_skill_left_is_refused(
        served: tuple[RemoteSandbox, Yard, Path], tmp_path: Path) -> None:
    """A link a skill left in the Run's folder on the server (to a folder outside it): a request sending a
    file through it is refused (400) and nothing is written where the link points."""
    client, yard, skill = served
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = yard.workdirs.ensure("run-1")
    (folder / "link").symlink_to(outside)
    body = client._job(job(skill, tmp_path / "client" / "run-1"))
    body["files"]["send"]["link/escaped.txt"] = base64.b64encode(b"escape").decode()
    answer = httpx.post(f"{client.url}/v1/run", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and "goes through a link" in answer.json()["error"], answer.text
    assert not (outside / "escaped.txt").exists()
