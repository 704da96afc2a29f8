"""Checkpoints are published without a person (SPEC A3b): the service's housekeeping and the Celery beat
publish one every checkpoint_interval_s when the chain has grown, to the database's folder and its
witnesses; replicas racing for the same checkpoint publish it once and never fail; a real `harness serve`
publishes on its own."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint_files import list_checkpoints
from harness.audit.verify import verify_chain
from harness.audit.witness import DirectoryWitness
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.service.worker import EmbeddedWorker
from harness.settings import Settings

from ..conftest import FIXTURES
from . import publishing_child

TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock, call_log: Path) -> Iterator[Runtime]:
    """A runtime that publishes a checkpoint every 60 s to tmp/cps and a directory witness."""
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                        identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data", memory="off",
                        checkpoint_interval_s=60, checkpoint_dir=tmp_path / "cps",
                        checkpoint_witnesses=(str(tmp_path / "witness"),))
    rt = build_runtime(settings, clock=clock)
    yield rt
    rt.close()


def test_the_service_publishes_a_checkpoint_every_interval(runtime: Runtime, clock: FakeClock,
                                                           tmp_path: Path) -> None:
    """The housekeeping pass publishes once the service has been up for an interval, not before; again once
    the interval has passed and the chain has grown; never for a chain that has not; each to the witness."""
    worker = EmbeddedWorker(runtime)
    runtime.runs.create_run({"task": "echo one", **TESTER})

    def pass_() -> Any:
        """One housekeeping pass; the checkpoint it published, if any."""
        before = worker.checkpoints.pending
        worker.housekeep()
        pending = worker.checkpoints.pending
        return pending.result(30) if pending is not None and pending is not before else None

    clock.advance(61)
    assert pass_() is None and list_checkpoints(tmp_path / "cps") == []  # the service started < 60 s ago
    worker.checkpoints.first_after = 0.0  # as if it had been up for an interval
    first = pass_()
    assert first is not None and first.witnessed == ((str(tmp_path / "witness"), None),)
    clock.advance(10)
    runtime.runs.create_run({"task": "echo two", **TESTER})
    assert pass_() is None
    clock.advance(60)
    second = pass_()
    assert second is not None and second.tree_size > first.tree_size
    clock.advance(120)
    assert pass_() is None  # nothing new to sign
    assert [cp.serial for cp in list_checkpoints(tmp_path / "cps")] == [1, 2]
    witness = DirectoryWitness(tmp_path / "witness")
    assert len(witness.checkpoints(runtime.store.database_id())) == 2
    assert verify_chain(SqlAuditReads(runtime.store), tmp_path / "cps", witnesses=[witness]).ok
    worker.stop()


def test_the_celery_beat_publishes_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beat schedules `harness.checkpoint` every HARNESS_CHECKPOINT_INTERVAL_S (none at 0); the task
    publishes when one is due and skips when another process published within the interval."""
    from harness import celery_app

    for name, value in (("HARNESS_DATABASE_URL", str(tmp_path / "celery.db")), ("HARNESS_CHECKPOINT_INTERVAL_S", "0"),
                        ("HARNESS_CHECKPOINT_DIR", str(tmp_path / "cps")), ("HARNESS_DATA_DIR", str(tmp_path / "d")),
                        ("HARNESS_MEMORY", "off")):
        monkeypatch.setenv(name, value)
    assert "harness-checkpoint" not in celery_app.make_app("memory://").conf.beat_schedule
    monkeypatch.setenv("HARNESS_CHECKPOINT_INTERVAL_S", "45")
    app = celery_app.make_app("memory://")
    assert app.conf.beat_schedule["harness-checkpoint"] == {"task": "harness.checkpoint", "schedule": 45.0}
    monkeypatch.setattr(celery_app._process, "runtime", None)
    try:
        rt = celery_app.runtime()
        rt.runs.create_run({"task": "Where is order A-1001?", "tenant_id": "acme", "user_id": "alice"})
        task = app.tasks["harness.checkpoint"]
        done = task.apply().get()
        assert Path(done["published"]).parent == tmp_path / "cps" and done["tree_size"] > 0
        assert task.apply().get() == {"published": None}
    finally:
        if celery_app._process.runtime is not None:
            celery_app._process.runtime.close()


def test_replicas_racing_publish_without_failing(backend_url: str, tmp_path: Path) -> None:
    """Two processes (replicas on one database) due at the same moment publish into the same folder: no
    error escapes, the checkpoints form one valid sequence and verify."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        publishing_child.grow(store)
    finally:
        store.close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"out-{i}.txt" for i in range(2)]
    procs = [ctx.Process(target=publishing_child.replica, args=(backend_url, str(tmp_path / "cps"), barrier, str(o)))
             for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0], [o.read_text() for o in outs if o.exists()]
    published = list_checkpoints(tmp_path / "cps")
    assert 1 <= len(published) <= 2 and [cp.serial for cp in published] == list(range(1, len(published) + 1))
    store = SqlStore.open(backend_url, FakeClock())
    try:
        report = verify_chain(SqlAuditReads(store), tmp_path / "cps")
        assert report.ok and report.checkpoints_checked == len(published), report
    finally:
        store.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_harness_serve_publishes_on_its_own(tmp_path: Path) -> None:
    """A real `harness serve`, with a 1 s interval, writes a signed checkpoint of its database to the
    configured folder without anyone asking."""
    db = tmp_path / "served.db"
    store = SqlStore.open(str(db))
    publishing_child.grow(store)
    store.close()
    env = {**os.environ, "HARNESS_CHECKPOINT_INTERVAL_S": "1", "HARNESS_CHECKPOINT_DIR": str(tmp_path / "cps"),
           "HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_MEMORY": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--db", str(db), "--port",
                             str(_free_port())], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "cps" / "checkpoint-00000001.json").exists():
            assert proc.poll() is None, "harness serve exited"
            assert time.monotonic() < deadline, "no checkpoint was published"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)
    store = SqlStore.open(str(db))
    try:
        assert verify_chain(SqlAuditReads(store), tmp_path / "cps").checkpoints_checked == 1
    finally:
        store.close()
