"""Accepted means executed across restarts (SPEC S1 / K5, queued is not stuck): one `harness serve` with a
single drive thread (its Runs each waiting a little for a model on loopback) builds a backlog of 60 accepted
Runs and is SIGKILLed three times while they wait, each time restarted; the test checks that Runs did
queue at every kill. Then it is stopped (SIGTERM): it must end within its 10 s and leave the Runs it has not
started queued, and a service with its default drive loop takes them up. The sweeper runs every second with
a CREATED threshold of one second, so every queued Run is long past its threshold and its heartbeat ceiling:
once such Runs were failed "stuck in CREATED" without ever running. Now every accepted Run ends SUCCEEDED
(or, for a call in flight at a kill, the honest "outcome unknown"), none is closed unrun, no side effect runs
twice, and verify and reconcile are clean.
The same holds when the service is killed while its drives are switched out, waiting for their model
calls. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.audit.verify import verify_chain
from tests.fakes.slow_model import SlowModel, price_file

from ..conftest import FIXTURES
from .test_service_replicas import FINAL_STATES, Replica, _key, calls

pytestmark = pytest.mark.slow
BACKENDS = ("sqlite", "postgresql", "mariadb")
RUNS = 60


class OneThread(Replica):
    """`harness serve --workers 1`: one Run driven at a time, so accepted Runs queue."""

    def command(self) -> list[str]:
        return [*super().command(), "--workers", "1"]


def _post(server: Replica, i: int) -> str:
    """Submit Run `i`, retrying (same idempotency key) while the server is down: accepted once."""
    for _ in range(300):
        try:
            answer = httpx.post(f"{server.url}/api/v1/runs", headers=_key(f"u{i}"), timeout=20,
                                json={"task": f"echo queued {i}", "idempotency_key": f"q{i}"})
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        assert answer.status_code in (200, 202), answer.text
        return str(answer.json()["run_id"])
    raise AssertionError(f"the server never accepted run {i}")


def test_a_backlog_survives_three_kills_and_every_accepted_run_succeeds(backend_url: str, tmp_path: Path,
                                                                        call_log: Path) -> None:
    """60 Runs accepted by a one-thread service killed three times while they queue: all SUCCEEDED (or
    outcome unknown for a call in flight at a kill), none failed unrun, each side effect once, audit clean."""
    # each Run waits a little for a (loopback) model, so the one drive thread finishes a Run in a few tenths
    # of a second while a batch of posts takes less: the Runs accepted so far are still queued at each kill
    with SlowModel(delay_s=0.1, step=_ECHO) as model:
        env = {**_service_env(tmp_path, call_log, model.url), "HARNESS_DRIVE_CONCURRENCY": "1"}
        _kill_during_backlog(backend_url, tmp_path, call_log, env)


def _kill_during_backlog(backend_url: str, tmp_path: Path, call_log: Path, env: dict[str, str]) -> None:
    SqlStore.open(backend_url).close()
    server: Replica = OneThread(env, backend_url, tmp_path / "serve.log")
    server.start()
    try:
        started = time.monotonic()
        run_ids = [_post(server, i) for i in range(RUNS // 4)]
        waiting = []
        for _ in range(3):  # each kill while the Runs accepted so far still queue behind the one thread
            waiting.append(_backlog(backend_url))
            server.kill()
            server.start()
            run_ids += [_post(server, i) for i in range(len(run_ids), len(run_ids) + RUNS // 4)]
        assert len(run_ids) == RUNS
        print(f"accepted {RUNS} across 3 kills in {time.monotonic() - started:.1f}s; queued at the kills: {waiting}")
        assert min(waiting) >= 3, f"the kills did not come while accepted Runs queued: {waiting}"
        # then a plain stop (SIGTERM, as a deploy sends): the service ends the Run it drives and leaves the
        # backlog (~45 Runs) queued, not worked through on its way out (which took the one drive thread past
        # the 10 s a stop is given, and then a SIGKILL); a service with its default drive loop takes it up
        server.stop()
        assert server.proc is not None and server.proc.returncode != -signal.SIGKILL, "the stop took over 10 s"
        left = _backlog(backend_url)
        assert left >= 3, f"the stopping service worked through the backlog instead of leaving it: {left} left"
        server = Replica({k: v for k, v in env.items() if k != "HARNESS_DRIVE_CONCURRENCY"}, backend_url,
                         tmp_path / "serve.log")
        server.start()
        store = SqlStore.open(backend_url)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if all(store.get_run(r).state.value in FINAL_STATES for r in run_ids):
                    break
                time.sleep(0.3)
            results = {r: store.get_run(r) for r in run_ids}
            outcome = Counter(r.state.value for r in results.values())
            unknown = [r for r in results.values() if "unknown" in str((r.result or {}).get("error"))]
            assert outcome["SUCCEEDED"] + len(unknown) == RUNS, (outcome, Counter(
                (r.state.value, str((r.result or {}).get("error"))[:160]) for r in results.values()
                if r.state.value != "SUCCEEDED" and r not in unknown))
            with store.engine.connect() as conn:
                unrun = conn.execute(sa.select(sa.func.count()).select_from(t.transitions).where(
                    t.transitions.c.from_state == "CREATED", t.transitions.c.to_state == "FAILED")).scalar_one()
            assert unrun == 0
            keys = Counter(c["key"] for c in calls(call_log))
            assert all(n == 1 for n in keys.values()), keys.most_common(3)
            server.stop()
            store.drain_all()
            assert verify_chain(SqlAuditReads(store)).ok
            assert reconcile(SqlReconcileReads(store)).ok
            print(f"{backend_url.split(':', maxsplit=1)[0]}: {dict(outcome)}")
        finally:
            store.close()
    finally:
        server.stop()


def test_runs_switched_out_on_their_model_call_survive_three_kills(backend_url: str, tmp_path: Path,
                                                                  call_log: Path) -> None:
    """The switch-out window: a service with its default drive loop, whose Runs all wait at once for a
    slow model (an OpenAI-compatible server on loopback, 1 s a call), is SIGKILLed three times while dozens
    of drives are switched out on their model calls. Every accepted Run ends SUCCEEDED (or outcome unknown
    for a call in flight at a kill), none is failed unrun or left waiting, each side effect runs once, and
    verify and reconcile are clean."""
    with SlowModel(delay_s=1.0, step=_ECHO) as model:
        env = _service_env(tmp_path, call_log, model.url)
        SqlStore.open(backend_url).close()
        server = Replica(env, backend_url, tmp_path / "serve.log")
        server.start()
        try:
            run_ids: list[str] = []
            waiting = []
            for _ in range(3):  # each kill while the Runs accepted so far wait on their model calls
                run_ids += [_post(server, i) for i in range(len(run_ids), len(run_ids) + RUNS // 4)]
                deadline = time.monotonic() + 20
                while model.in_flight < 5 and time.monotonic() < deadline:
                    time.sleep(0.05)
                waiting.append(model.in_flight)
                server.kill()
                server.start()
            run_ids += [_post(server, i) for i in range(len(run_ids), RUNS)]
            assert min(waiting) >= 5, f"the kills did not come while drives waited on the model: {waiting}"
            store = SqlStore.open(backend_url)
            try:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    if all(store.get_run(r).state.value in FINAL_STATES for r in run_ids):
                        break
                    time.sleep(0.3)
                results = {r: store.get_run(r) for r in run_ids}
                outcome = Counter(r.state.value for r in results.values())
                unknown = [r for r in results.values() if "unknown" in str((r.result or {}).get("error"))]
                assert outcome["SUCCEEDED"] + len(unknown) == RUNS, (outcome, Counter(
                    (r.state.value, str((r.result or {}).get("error"))[:160]) for r in results.values()
                    if r.state.value != "SUCCEEDED" and r not in unknown))
                with store.engine.connect() as conn:
                    unrun = conn.execute(sa.select(sa.func.count()).select_from(t.transitions).where(
                        t.transitions.c.from_state == "CREATED", t.transitions.c.to_state == "FAILED")).scalar_one()
                assert unrun == 0
                keys = Counter(c["key"] for c in calls(call_log))
                assert all(n == 1 for n in keys.values()), keys.most_common(3)
                server.stop()
                store.drain_all()
                assert verify_chain(SqlAuditReads(store)).ok
                assert reconcile(SqlReconcileReads(store)).ok
                print(f"{backend_url.split(':', maxsplit=1)[0]}: model calls in flight at the kills {waiting}; "
                      f"{dict(outcome)}")
            finally:
                store.close()
        finally:
            server.stop()


#: the one step of every plan the slow model answers
_ECHO = {"id": "a", "tool_call": {"skill": "test.echo", "arguments": {"text": "switched out"}}, "output_key": "a"}


def _service_env(tmp_path: Path, call_log: Path, model_url: str) -> dict[str, str]:
    """Both tests' service: the test skills and policy, a key per Run's user, the slow model on loopback (its
    model priced), short leases, a sweeper every second with a CREATED threshold of one second."""
    return {**os.environ, "HARNESS_SKILLS_DIRS": str(FIXTURES / "skills"),
            "HARNESS_POLICY_FILE": str(FIXTURES / "policy.yaml"), "HARNESS_IDENTITIES": str(_identities(tmp_path)),
            "HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_TEST_CALL_LOG": str(call_log),
            "HARNESS_LLM": "openai", "HARNESS_LLM_MODEL": "gpt-test", "HARNESS_LLM_BASE_URL": model_url,
            "HARNESS_LLM_API_KEY_ENV": "SLOW_MODEL_KEY", "SLOW_MODEL_KEY": "sk-test",
            "HARNESS_LLM_PRICING": str(price_file(tmp_path)),
            "HARNESS_LEASE_TTL_S": "2", "HARNESS_REDRIVE_GRACE_S": "0.5", "HARNESS_HOUSEKEEPING_S": "0.2",
            "HARNESS_SWEEP_INTERVAL_S": "1", "HARNESS_STATE_THRESHOLDS": "CREATED=1",
            "HARNESS_SESSION_SECRET": "queue-secret-queue-secret", "HARNESS_MEMORY": "off"}


def _backlog(url: str) -> int:
    store = SqlStore.open(url)
    try:
        return store.backlog(RUNS)
    finally:
        store.close()


def _identities(tmp_path: Path) -> Path:
    """The fixture identities plus a tester with an API key per Run (each user's spend cap is small), and
    t1/dan's key for the health probe."""
    import hashlib

    import yaml

    doc = yaml.safe_load((FIXTURES / "identities.yaml").read_text()) or {}
    for user in ("dan", *(f"u{i}" for i in range(RUNS))):
        doc.setdefault("identities", {})[f"t1/{user}"] = {
            "roles": ["tester"], "api_key_sha256": hashlib.sha256(f"key-{user}".encode()).hexdigest()}
    path = tmp_path / "identities-with-keys.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
