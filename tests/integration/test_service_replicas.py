"""Several `harness serve` replicas on one database, approvals raced across them and replicas SIGKILLed
under load (SPEC G4, K5, K5b, S1, D1).

Real service processes, real HTTP, the same database on every backend. Approving one request as the
same person through both replicas at once counts once. With a replica killed and restarted while Runs
are being accepted and approved, every accepted Run is executed: re-driven by a live replica (or the
restarted one) instead of being failed by the sweeper; a client's retry with the same idempotency key
gets the same Run.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from harness.adapters.sql import schema as t
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.kernel.states import FINAL

from ..conftest import FIXTURES

pytestmark = pytest.mark.slow
USERS = ["dan", "pat", "quinn", *(f"u{i}" for i in range(40))]
FINAL_STATES = frozenset(s.value for s in FINAL)
ROLES = {"dan": ["tester", "deployer"], "pat": ["prod_approver"], "quinn": ["prod_approver"]}


def _key(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{user}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica:
    """One `harness serve` process on the shared database; killed and restarted at will."""

    def __init__(self, env: dict[str, str], db: str, log: Path) -> None:
        self.env, self.db, self.log = env, db, log
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "harness.cli", "serve", "--port", str(self.port), "--db", self.db]

    def start(self) -> None:
        self.launch()
        self.wait_up()

    def launch(self) -> None:
        """Start the process without waiting for it to answer (several replicas then come up together)."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def wait_up(self) -> None:
        """Wait until the launched process answers /health."""
        assert self.proc is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", headers=_key("dan"), timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            time.sleep(0.1)
        raise AssertionError(f"replica on port {self.port} did not come up")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def service_env(tmp_path: Path, call_log: Path) -> dict[str, str]:
    """The environment of a service process over the test fixtures, with short leases so a dead process's
    Runs are picked up fast."""
    identities = {"identities": {
        f"t1/{u}": {"roles": ROLES.get(u, ["tester"]),
                    "api_key_sha256": hashlib.sha256(f"key-{u}".encode()).hexdigest()} for u in USERS}}
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    return {**os.environ,
            "HARNESS_SKILLS_DIRS": str(FIXTURES / "skills"), "HARNESS_POLICY_FILE": str(FIXTURES / "policy.yaml"),
            "HARNESS_LLM_RULES": str(FIXTURES / "llm_rules.yaml"),
            "HARNESS_IDENTITIES": str(tmp_path / "identities.yaml"), "HARNESS_DATA_DIR": str(tmp_path / "data"),
            "HARNESS_TEST_CALL_LOG": str(call_log), "HARNESS_LEASE_TTL_S": "2", "HARNESS_REDRIVE_GRACE_S": "0.5",
            "HARNESS_HOUSEKEEPING_S": "0.2", "HARNESS_SESSION_SECRET": "replica-secret-replica-secret"}


@pytest.fixture
def replicas(backend_url: str, tmp_path: Path, call_log: Path) -> Iterator[list[Replica]]:
    """Two replicas over the test fixtures."""
    env = service_env(tmp_path, call_log)
    SqlStore.open(backend_url).close()  # migrated once, before two processes race to do it
    pair = [Replica(env, backend_url, tmp_path / f"replica-{i}.log") for i in range(2)]
    for replica in pair:  # both start at once: each spends seconds importing before it listens
        replica.launch()
    for replica in pair:
        replica.wait_up()
    yield pair
    for replica in pair:
        replica.stop()


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_same_approver_through_two_replicas_counts_once(replicas: list[Replica], call_log: Path) -> None:
    """Eight approvals of one L4 request by the same person, sent at once to two replicas, count once; then
    that person and a second approver at once complete it once, and the L4 action runs once."""
    created = httpx.post(f"{replicas[0].url}/api/v1/runs", json={"task": "ship prod"}, headers=_key("dan"),
                         params={"wait": "true", "timeout": 30}, timeout=40)
    assert created.status_code == 202, created.text
    request_id = created.json()["approval_request_id"]

    def approve(replica: Replica, user: str) -> int:
        return httpx.post(f"{replica.url}/api/v1/approvals/{request_id}/decision", json={"decision": "approve"},
                          headers=_key(user), timeout=30).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: approve(replicas[i % 2], "pat"), range(8)))
    assert Counter(codes) == Counter({200: 1, 403: 7}), codes
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda job: approve(*job), [(replicas[0], "pat"), (replicas[1], "pat"),
                                                          (replicas[0], "quinn"), (replicas[1], "quinn")]))
    assert codes.count(200) == 1, codes
    run_id = created.json()["run_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = httpx.get(f"{replicas[1].url}/api/v1/runs/{run_id}", headers=_key("dan")).json()["state"]
        if state in {s.value for s in FINAL}:
            break
        time.sleep(0.2)
    assert state == "SUCCEEDED"
    assert [c["step"] for c in calls(call_log) if c["skill"] == "test.echo"] == ["a"]


def _post(replicas: list[Replica], start: int, path: str, *, body: dict[str, Any], user: str,
          attempts: int = 60) -> httpx.Response:
    """POST to the replicas in turn from `start`, until one answers (a killed replica refuses)."""
    for attempt in range(attempts):
        replica = replicas[(start + attempt) % len(replicas)]
        try:
            return httpx.post(f"{replica.url}{path}", json=body, headers=_key(user), timeout=20)
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"no replica answered POST {path}")


def _submit(replicas: list[Replica], count: int) -> dict[int, str]:
    """Submit `count` Runs across the replicas (even: L1 echo, odd: an L2 update its requester confirms);
    every fifth is submitted again with the same idempotency key, as a client that lost the answer would."""
    run_of: dict[int, str] = {}
    for i in range(count):
        task = f"echo run {i}" if i % 2 == 0 else f"update T-{i}"
        answer = _post(replicas, i, "/api/v1/runs", body={"task": task, "idempotency_key": f"k{i}"}, user=f"u{i}")
        assert answer.status_code in (200, 202), answer.text
        run_of[i] = answer.json()["run_id"]
        if i % 5 == 0:
            again = _post(replicas, i + 1, "/api/v1/runs", body={"task": task, "idempotency_key": f"k{i}"},
                          user=f"u{i}")
            assert again.status_code == 200 and again.json()["run_id"] == run_of[i], again.text
        time.sleep(0.05)
    return run_of


def _confirm(replicas: list[Replica], run_of: dict[int, str]) -> None:
    """Each requester of an update confirms it (L2) once it waits, through whichever replica answers."""
    pending = {i for i in run_of if i % 2 == 1}
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for i in sorted(pending):
            doc = _get(replicas, i, f"/api/v1/runs/{run_of[i]}", f"u{i}")
            if doc["state"] == "AWAITING_HITL" and doc.get("approval_request_id"):
                answer = _post(replicas, i, f"/api/v1/approvals/{doc['approval_request_id']}/decision",
                               body={"decision": "approve"}, user=f"u{i}")
                if answer.status_code in (200, 403, 409):
                    pending.discard(i)
            elif doc["state"] in FINAL_STATES or doc["state"] == "EXECUTING":
                pending.discard(i)
        time.sleep(0.2)
    assert not pending, pending


def _wait_final(store: SqlStore, run_ids: list[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(store.get_run(r).state.value in FINAL_STATES for r in run_ids):
            return
        time.sleep(0.3)


def test_every_accepted_run_is_executed_across_replica_kills(replicas: list[Replica], backend_url: str,
                                                              call_log: Path) -> None:
    """40 Runs (half need their requester's confirmation) accepted and approved through two replicas while one
    is SIGKILLed and restarted three times: every accepted Run ends SUCCEEDED (or, for a call that was in
    flight at a kill, the honest "outcome unknown"), none is closed by the sweeper, no side effect ran twice,
    and a retried submit with the same idempotency key is the same Run."""
    rng = random.Random(7)
    stop = threading.Event()

    def killer() -> None:
        for _ in range(3):
            if stop.wait(rng.uniform(0.5, 1.5)):
                return
            replicas[0].kill()
            time.sleep(rng.uniform(0.1, 0.6))
            replicas[0].start()

    chaos = threading.Thread(target=killer)
    chaos.start()
    try:
        run_of = _submit(replicas, 40)
        _confirm(replicas, run_of)
    finally:
        stop.set()
        chaos.join()
    store = SqlStore.open(backend_url)
    try:
        _wait_final(store, list(run_of.values()))
        results = {i: store.get_run(r) for i, r in run_of.items()}
        unknown = [i for i, r in results.items() if r.state.value == "CLOSED_FAILED"
                   and "unknown" in str((r.result or {}).get("error"))]
        outcome = Counter(r.state.value for r in results.values())
        assert outcome["SUCCEEDED"] + len(unknown) == len(run_of), (outcome, {
            i: (r.state.value, r.result) for i, r in results.items() if r.state.value != "SUCCEEDED"})
        with store.engine.connect() as conn:
            swept = conn.execute(sa.select(sa.func.count()).select_from(t.transitions).where(
                t.transitions.c.forced_by == "zombie_sweeper")).scalar_one()
        assert swept == 0
        keys = Counter(c["key"] for c in calls(call_log))
        assert all(n == 1 for n in keys.values()), keys.most_common(3)
        store.drain_all()
        assert reconcile(SqlReconcileReads(store)).ok
        print(f"accepted {len(run_of)}, succeeded {outcome['SUCCEEDED']}, outcome unknown {len(unknown)}")
    finally:
        store.close()


def _get(replicas: list[Replica], start: int, path: str, user: str) -> dict[str, Any]:
    for attempt in range(60):
        replica = replicas[(start + attempt) % len(replicas)]
        try:
            answer = httpx.get(f"{replica.url}{path}", headers=_key(user), timeout=20)
            doc: dict[str, Any] = answer.json()
            return doc
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"no replica answered GET {path}")
