"""One Celery worker process drives many Runs at once: `harness worker` hands each Run to its drive loop,
where a Run waiting for its model holds no thread (not one Run per prefork child).

A single `harness worker` process on a private broker drives 80 Runs of the support example against a
slow OpenAI-compatible model on loopback: their model calls are in flight together, every Run succeeds,
and the chain verifies. SIGKILLing the worker with Runs in flight loses none of them: the sweep re-queues
them to a new worker once their leases lapse.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.audit.verify import verify_chain
from harness.config import build_runtime
from harness.kernel.states import FINAL
from harness.settings import Settings
from harness.stores import audit_reads
from tests.fakes.slow_model import SlowModel, price_file

from .test_celery_chaos import _free_port, _start_redis

BACKENDS = ("sqlite", "postgresql", "mariadb")
LEASE_TTL = "3"

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def _worker(environ: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "worker", "-c", "500"], env=environ,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def test_one_worker_process_drives_many_runs_and_loses_none_to_a_kill(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    redis = _start_redis(tmp_path, port)
    prices = price_file(tmp_path)
    with SlowModel(delay_s=0.5) as model:
        environ = {**os.environ, "HARNESS_DATABASE_URL": backend_url,
                   "HARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0", "HARNESS_DATA_DIR": str(tmp_path / "data"),
                   "HARNESS_EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl"), "HARNESS_LLM": "openai",
                   "HARNESS_LLM_MODEL": "gpt-test", "HARNESS_LLM_BASE_URL": model.url,
                   "HARNESS_LLM_API_KEY_ENV": "TEST_KEY", "TEST_KEY": "sk-test", "HARNESS_LLM_PRICING": str(prices),
                   "HARNESS_MEMORY": "off", "HARNESS_LEASE_TTL_S": LEASE_TTL, "HARNESS_CHECKPOINT_INTERVAL_S": "0"}
        for key, value in environ.items():
            if key.startswith(("HARNESS_", "TEST_")):
                monkeypatch.setenv(key, value)
        from harness import celery_app

        app = celery_app.make_app(environ["HARNESS_BROKER_URL"])
        rt = build_runtime(Settings.from_env())
        log = tmp_path / "worker.log"
        worker = _worker(environ, log)
        try:
            def submit(count: int, label: str) -> list[str]:
                queued = []
                for i in range(count):
                    run, _ = rt.runs.submit({"task": f"Where is order A-1001? ({label} {i})", "user_id": "alice",
                                             "roles": ["support_agent"]})
                    app.send_task("harness.drive", args=[run.run_id])
                    queued.append(run.run_id)
                return queued

            def final() -> int:
                return sum(rt.store.get_run(r).state in FINAL for r in run_ids)

            run_ids = submit(80, "first")
            _wait_until(lambda: final() >= 80, 120, log)
            assert model.peak_in_flight >= 50, model.peak_in_flight  # one process, its model calls together

            # a second batch, and the worker killed while it drives them: none is lost
            second = submit(30, "again")
            _wait_until(lambda: model.in_flight >= 10, 60, log)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker = _worker(environ, log)
            run_ids += second
            deadline = time.monotonic() + 120
            while final() < len(run_ids) and time.monotonic() < deadline:
                for run_id in celery_app.orphans(rt, grace_s=float(LEASE_TTL)):  # what beat's sweep re-queues
                    app.send_task("harness.drive", args=[run_id])
                time.sleep(1.0)
            states = Counter(rt.store.get_run(r).state.value for r in run_ids)
            assert states == {"SUCCEEDED": len(run_ids)}, states
            rt.store.drain_all()
            assert verify_chain(audit_reads(rt.store)).ok
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            rt.close()
            redis.kill()
            redis.wait()


def _wait_until(predicate: object, seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out; worker log:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
