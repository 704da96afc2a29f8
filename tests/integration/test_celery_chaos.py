"""Chaos: Celery workers drive many Runs while one is SIGKILLed, one is SIGSTOPped past its lease and
resumed after the sweep, and the broker is restarted (issue 8, SPEC S1-S3, K5b, T6).

Afterwards every Run is final, none has two final states, reconcile and verify are clean, and no
non-idempotent call ran twice. The size is `HARNESS_CHAOS_RUNS` (default 90 keeps the suite short: at
the kill some 18 are final and 72 wait, in flight or queued; run with a few thousand for the full exercise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.audit.reconcile import reconcile
from harness.audit.verify import verify_chain
from harness.config import build_runtime
from harness.kernel.states import FINAL
from harness.settings import Settings

from ..conftest import FIXTURES

RUNS = int(os.environ.get("HARNESS_CHAOS_RUNS", "90"))
BACKENDS = ("sqlite", "postgresql")
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
LEASE_TTL = "2"
#: on SQLite, seconds without a Run finishing (ten sweeps) before the frozen worker is woken: by then the
#: sweep has long re-queued what it held (2 s lease), and no Run can finish while it holds the write lock
STALL_S = 5.0

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def _free_port() -> int:
    """A loopback port nobody listens on now (the broker is private to this test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _start_redis(folder: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _port_open(port):
        assert time.monotonic() < deadline, "private redis did not start"
        time.sleep(0.05)
    return proc


_BROKERS: list[subprocess.Popen[bytes]] = []


@pytest.fixture
def env(tmp_path: Path, call_log: Path, backend_url: str) -> Iterator[dict[str, str]]:
    """Environment for the workers: the test skills, a fresh database, a private broker on loopback."""
    port = _free_port()
    redis = _start_redis(tmp_path, port)
    environ = {**os.environ,
               "_redis_port": str(port),
               "HARNESS_DATABASE_URL": backend_url,
               "HARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0",
               "HARNESS_SKILLS_DIRS": str(FIXTURES / "skills"),
               "HARNESS_POLICY_FILE": str(FIXTURES / "policy.yaml"),
               "HARNESS_LLM_RULES": str(FIXTURES / "llm_rules.yaml"),
               "HARNESS_IDENTITIES": str(FIXTURES / "identities.yaml"),
               "HARNESS_DATA_DIR": str(tmp_path / "data"),
               "HARNESS_LEASE_TTL_S": LEASE_TTL,
               "HARNESS_TEST_CALL_LOG": str(call_log)}
    environ["_redis_pid"] = str(redis.pid)
    yield environ
    for broker in [redis, *_BROKERS]:  # the first broker and any restarted one
        broker.kill()
        broker.wait()
    _BROKERS.clear()


def _worker(environ: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "harness.celery_app:app", "worker", "--pool=solo",
         "--concurrency=1", "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel=WARNING"], env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


#: Retried once (a loaded machine can push a Run past a deadline); a second failure fails the suite.
@pytest.mark.flaky(reruns=1)
def test_chaos_every_run_ends_once_and_no_side_effect_repeats(env: dict[str, str], tmp_path: Path,
                                                                call_log: Path, backend: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL, SIGSTOP past the lease, a broker restart and (on PostgreSQL) every database connection
    dropped: every Run final exactly once, audit clean, no non-idempotent call duplicated, and the
    stopped worker adds no side effect after it resumes."""
    for key, value in env.items():  # undone after the test: later tests in this process see their own
        if key.startswith("HARNESS_"):
            monkeypatch.setenv(key, value)
    from harness import celery_app

    app = celery_app.make_app(env["HARNESS_BROKER_URL"])
    rt = build_runtime(Settings.from_env())
    workers = {name: _worker(env, name) for name in ("w1", "w2", "w3")}
    try:
        tasks = [("echo chaos" if i % 3 else "hang-idem 0.05") for i in range(RUNS)]
        run_ids = []
        for i, task in enumerate(tasks):
            run, _ = rt.runs.submit({"task": task, "tenant_id": "t1", "user_id": f"u{i % 7}", "roles": ["tester"]})
            app.send_task("harness.drive", args=[run.run_id])
            run_ids.append(run.run_id)

        def finished() -> int:
            return sum(rt.store.get_run(r).state in FINAL for r in run_ids)

        _wait_until(lambda: finished() >= RUNS // 5, 120)
        workers["w1"].send_signal(signal.SIGKILL)  # a worker dies mid-flight
        workers["w1"].wait()
        workers["w4"] = _worker(env, "w4")
        workers["w2"].send_signal(signal.SIGSTOP)  # a worker freezes past its lease
        time.sleep(float(LEASE_TTL) + 1)
        _sweep(rt, app)  # the sweep re-queues what the frozen and the dead worker held
        redis_pid = int(env["_redis_pid"])
        os.kill(redis_pid, signal.SIGKILL)  # the broker restarts, losing its queue (no persistence)
        time.sleep(0.5)
        restarted = _start_redis(tmp_path, int(env["_redis_port"]))
        _BROKERS.append(restarted)
        env["_redis_pid"] = str(restarted.pid)
        if backend == "postgresql":
            _drop_connections(env["HARNESS_DATABASE_URL"])  # the database drops every worker's connection
        deadline = time.monotonic() + 240
        done, progressed, frozen = finished(), time.monotonic(), True
        while done < RUNS and time.monotonic() < deadline:
            _sweep(rt, app)
            time.sleep(0.5)
            if finished() > done:
                done, progressed = finished(), time.monotonic()
            elif frozen and backend == "sqlite" and time.monotonic() - progressed > STALL_S:
                # SQLite has one write lock for the whole file: frozen while it held it, the worker stops
                # every other writer until it wakes (a server database locks rows, and the others go on)
                workers["w2"].send_signal(signal.SIGCONT)
                frozen = False
        workers["w2"].send_signal(signal.SIGCONT)  # the frozen worker wakes up
        time.sleep(2.0)
        assert finished() == RUNS, Counter(rt.store.get_run(r).state.value for r in run_ids)
        _assert_clean(rt, run_ids, call_log)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
        rt.close()


def _drop_connections(url: str) -> None:
    """Terminate every session on this database, as a failover or a network cut would."""
    import sqlalchemy as sa

    database = sa.engine.make_url(url).database
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        killed = conn.execute(sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                      "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database}).scalar()
    admin.dispose()
    assert killed, "no connection was dropped"


def _sweep(rt: object, app: object) -> None:
    from harness import celery_app

    for run_id in celery_app.orphans(rt, grace_s=float(LEASE_TTL)):  # type: ignore[arg-type]
        app.send_task("harness.drive", args=[run_id])  # type: ignore[attr-defined]


def _wait_until(predicate: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _assert_clean(rt: object, run_ids: list[str], call_log: Path) -> None:
    """One final state per Run, audit clean, and no non-idempotent call key seen twice (which is also
    where any call the frozen worker made after waking up would show)."""
    store = rt.store  # type: ignore[attr-defined]
    for run_id in run_ids:
        path = [t.to_state.value for t in store.transitions_of(run_id)]
        assert sum(s in {f.value for f in FINAL} for s in path) == 1, path
    store.drain_all()
    assert reconcile(SqlReconcileReads(store)).ok
    assert verify_chain(SqlAuditReads(store)).ok
    log = [json.loads(line) for line in call_log.read_text().splitlines()]
    echoes = Counter(entry["key"] for entry in log if entry["skill"] == "test.echo")
    assert echoes and max(echoes.values()) == 1, [k for k, n in echoes.items() if n > 1]
