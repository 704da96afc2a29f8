"""A webhook receiver SIGKILLed mid-delivery (SPEC P4 / N1): the event reaches it again once it is back.

The receiver's side of a delivery holds no database state, so SQLite alone; the outbox's multi-process
tests (test_webhooks_processes.py) run on every backend.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from harness.clock import FakeClock
from tests.fakes.webhook_receiver import read_log, start_process
from tests.integration.test_races import start_forked

from .test_webhooks_processes import _assert_signed_and_same, _free_port
from .webhook_setup import webhook_runtime, write_config

pytestmark = pytest.mark.slow
BACKENDS = ("sqlite",)


def test_a_receiver_killed_mid_delivery_gets_the_event_again(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_log: Path) -> None:
    """A receiver SIGKILLed while it holds a delivery (body read, no answer) makes the attempt fail; the
    retry reaches the restarted receiver with the same webhook-id and a valid signature."""
    port, log = _free_port(), str(tmp_path / "received.jsonl")
    config = write_config(tmp_path, monkeypatch, timeout_s=20.0, lease_s=60)
    clock = FakeClock(time.time())
    rt = webhook_runtime(backend_url, tmp_path, config, clock)
    hanging = start_process(port, log, "hang")
    try:
        rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"],
                            "callback": f"http://127.0.0.1:{port}/hooks"})
        dispatcher = rt.dispatcher()
        ctx = mp.get_context("fork")
        killer = ctx.Process(target=_kill_when_logged, args=(hanging.pid, log))
        start_forked(rt.store, killer)
        started = time.monotonic()
        report = dispatcher.deliver_once()
        assert time.monotonic() - started < 15, "the send waited for its timeout: the kill did not land mid-send"
        killer.join(30)
        assert report.retrying and not report.delivered
    finally:
        hanging.kill()
        hanging.wait(10)
    healthy = start_process(port, log, "ok")
    try:
        clock.advance(11)
        assert len(dispatcher.deliver_once().delivered) == 1
    finally:
        healthy.kill()
        healthy.wait(10)
        dispatcher.close()
    counts = _assert_signed_and_same(read_log(log))
    assert list(counts.values()) == [2]
    rt.close()


def _kill_when_logged(pid: int, log: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not read_log(log):
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
