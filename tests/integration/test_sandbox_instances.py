"""Sandboxes as a scarce resource: a Run's instance of a skill lives through its later calls, a wait for a
human and a restart of the harness process (and is re-created, traced, over the preserved working
directory when its process is gone); ports come from a per-host pool and are reclaimed from dead
instances; caps per tenant and per host make a call wait, then fail with a traced reason; bubblewrap
stays the wall: only the Run's own later calls reach a service inside its instance.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sandbox.instance import alive, process_start
from harness.adapters.sql import schema as t
from harness.config import Runtime, build_runtime
from harness.domain.errors import InvalidRequestError
from harness.domain.sandbox import DEAD, LIVE, RELEASED, Holder, InstanceRow, SandboxJob
from harness.kernel.states import RunState
from harness.pipeline.sandbox_pool import SandboxUnavailableError
from harness.settings import Settings
from tests.acceptance.agent_skills import TESTER
from tests.acceptance.checks import assert_audit_clean
from tests.integration.conftest import port_open
from tests.integration.instance_skills import instance_settings
from tests.integration.test_child_runs import children, eventually, harness, kill, purges, start_driver
from tests.integration.test_sandbox import need_bwrap

BACKENDS = ("sqlite",)


@pytest.fixture
def world(tmp_path: Path, call_log: Path) -> Iterator[Runtime]:
    """This test process's runtime over the instance skills, on SQLite."""
    need_bwrap()
    rt = build_runtime(instance_settings(tmp_path))
    yield rt
    for row in rt.tools.sandbox_pool.table.live() if rt.tools.sandbox_pool else []:  # nothing outlives a test
        assert rt.tools.sandbox_pool is not None
        rt.tools.sandbox_pool.table.end_now(row, DEAD, "the test ended", rt.store.clock.now())
    if rt.tools.sandbox_pool:
        rt.tools.sandbox_pool.stop_ended()
    rt.close()


@pytest.fixture
def drivers() -> Iterator[list[Any]]:
    """Driver processes a test starts: any still alive when it ends (it failed early) is killed."""
    started: list[Any] = []
    yield started
    for proc in started:
        if proc.is_alive():
            proc.kill()
        proc.join(30)


def instance_of(rt: Runtime, run_id: str, skill_id: str = "test.devserver") -> InstanceRow:
    assert rt.tools.sandbox_pool is not None
    row = rt.tools.sandbox_pool.table.get(run_id, skill_id)
    assert row is not None, f"no instance of {skill_id} for {run_id}"
    return row


def events(rt: Runtime, run_id: str, prefix: str = "sandbox_") -> list[tuple[str, dict[str, Any]]]:
    return [(e.event, e.detail) for e in rt.store.audit_events(run_id=run_id) if e.event.startswith(prefix)]


def assert_one_instance_served_then_released(rt: Runtime, run_id: str, first: InstanceRow,
                                             instance_killed: bool) -> None:
    """The Run's two calls had one instance (`first`, as its first call left it): kept (generation 1) or
    re-created once, traced, with the same port; released at the close with every process of it gone, its
    units back in the pool, its seconds billed once; the audit chain intact."""
    trail = [name for name, _ in events(rt, run_id)]
    assert trail == ["sandbox_instance_created", *(["sandbox_instance_recreated"] if instance_killed else []),
                     "sandbox_instance_released"]
    if instance_killed:
        (recreated,) = [d for n, d in events(rt, run_id) if n == "sandbox_instance_recreated"]
        assert recreated["reason"] == "its process was gone" and recreated["ports"] == list(first.ports)
        assert recreated["instance_id"] == first.instance_id
    ended = instance_of(rt, run_id)
    assert ended.instance_id == first.instance_id and ended.generation == (2 if instance_killed else 1)
    assert ended.state == RELEASED and ended.pid is None and ended.calls == 2
    pids = [d["pid"] for n, d in events(rt, run_id) if "pid" in d]  # every generation's process
    assert len(pids) == (2 if instance_killed else 1)
    assert all(process_start(pid) is None for pid in pids), "the released instance's processes are gone"
    assert rt.tools.sandbox_pool is not None
    use = rt.tools.sandbox_pool.table.use()
    assert use.ports_by_host == {} and use.live_by_host == {}
    with rt.store.reader.connect() as conn:
        billed = conn.execute(sa.select(t.costs.c.sandbox_s).where(
            t.costs.c.run_id == run_id, t.costs.c.source == "sandbox_instance:bwrap:test.devserver")).scalars().all()
    assert len(billed) == 1 and billed[0] == pytest.approx(ended.held_s)  # the instance's seconds, once
    assert rt.runs.ledger.run_total(run_id).sandbox_s >= billed[0]
    assert_audit_clean(rt)


@pytest.mark.parametrize("instance_killed", [False, True], ids=["kept", "recreated"])
def test_a_service_from_step_one_answers_step_two_across_an_approval_and_a_restart(
        world: Runtime, tmp_path: Path, call_log: Path, instance_killed: bool) -> None:
    """Step a starts an HTTP server in the Run's instance on its leased port; the Run then waits for a
    human (its child Run needs an approval) and the process driving it is SIGKILLed; the approval, from
    another process, resumes it and step c fetches the page from that server. Meanwhile neither the host
    nor another Run reaches the server. If the instance's own process was killed too (a machine restart),
    step c gets a re-created instance over the preserved working directory, with the same port, traced."""
    parent_id = world.runs.submit({"task": "serve hello then wait", **TESTER})[0].run_id
    proc = start_driver(tmp_path, world.settings.db or "", parent_id, 3.0, call_log)
    eventually(lambda: [world.store.state_of(c) for c in children(world, parent_id)] == [RunState.AWAITING_HITL],
               "the child parks for approval")
    row = instance_of(world, parent_id)
    (port,) = row.ports
    assert row.state == LIVE and row.isolation == "bwrap" and alive(Holder(row.pid, row.pid_start))
    assert not port_open(port), "the host's loopback must not reach a service inside the instance"
    probe = world.runs.create_run({"task": f"probe {port}", **TESTER})
    assert probe.state == "SUCCEEDED" and probe.artifacts["a"]["reached"] is False, probe.error
    kill(proc, world, parent_id)  # the harness process that created the instance is gone
    assert alive(Holder(row.pid, row.pid_start)), "the instance outlives the process that started it"
    if instance_killed:
        os.kill(row.pid or 0, signal.SIGKILL)
        eventually(lambda: not alive(Holder(row.pid, row.pid_start)), "the instance's process is gone")
    (request,) = world.hitl.pending("t1")
    harness(tmp_path, call_log, "approve", request.request_id, "--as", "t1/lee", "--db", world.settings.db or "")

    result = world.runs.result(parent_id)
    assert result.state == "SUCCEEDED" and result.answer == "the site said hello", result
    step_c = result.artifacts["c"]
    assert step_c["port"] == port and step_c["restarted"] is instance_killed
    assert step_c["generation"] == (2 if instance_killed else 1)
    assert_one_instance_served_then_released(world, parent_id, row, instance_killed)  # steps a and c


@pytest.mark.parametrize("instance_killed", [False, True], ids=["kept", "recreated"])
def test_a_run_parked_for_its_own_approval_keeps_its_instance_across_a_restart(
        world: Runtime, tmp_path: Path, call_log: Path, drivers: list[Any], instance_killed: bool) -> None:
    """Round 1 starts an HTTP server in the Run's instance on its leased port; round 2, planned from that
    result, holds an L3 step, so the Run itself parks AWAITING_HITL with its instance kept. The process
    that drove it is SIGKILLed; the approval, from another process, resumes the Run there and the query
    of round 2 fetches the page from the same instance's server. If the instance's own process was killed
    too, the query gets a re-created instance over the preserved working directory, same port, traced."""
    run_id = world.runs.submit({"task": "serve hello then ask", **TESTER})[0].run_id
    proc = start_driver(tmp_path, world.settings.db or "", run_id, 3.0, call_log, linger=True)
    drivers.append(proc)
    eventually(lambda: world.store.state_of(run_id) == RunState.AWAITING_HITL, "the Run parks for approval")
    parked = world.runs.result(run_id)
    assert list(parked.path) == ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "PLANNING",
                                 "POLICY_CHECK", "AWAITING_HITL"]
    row = instance_of(world, run_id)
    (port,) = row.ports
    assert row.state == LIVE and row.isolation == "bwrap" and row.calls == 1 and alive(Holder(row.pid, row.pid_start))
    assert [n for n, _ in events(world, run_id)] == ["sandbox_instance_created"]  # not released by the wait
    assert not port_open(port), "the host's loopback must not reach a service inside the instance"
    probe = world.runs.create_run({"task": f"probe {port}", **TESTER})
    assert probe.state == "SUCCEEDED" and probe.artifacts["a"]["reached"] is False, probe.error
    (request,) = world.hitl.pending("t1")
    assert request.run_id == run_id and request.level == "L3"
    assert [a["step_id"] for a in request.actions] == ["b", "c"]  # the round's steps, approved together
    assert purges(call_log) == []  # nothing of round 2 ran before the approval
    assert proc.is_alive()
    kill(proc, world, run_id)  # the harness process that created the instance is gone, never closed
    assert alive(Holder(row.pid, row.pid_start)), "the instance outlives the process that started it"
    if instance_killed:
        os.kill(row.pid or 0, signal.SIGKILL)
        eventually(lambda: not alive(Holder(row.pid, row.pid_start)), "the instance's process is gone")
    decided = harness(tmp_path, call_log, "approve", request.request_id, "--as", "t1/lee",
                      "--db", world.settings.db or "")
    assert decided["effect"] == "approved" and decided["run"]["state"] == "SUCCEEDED", decided

    result = world.runs.result(run_id)
    assert result.state == "SUCCEEDED" and result.answer == f"the site on port {port} said hello", result
    assert list(result.path)[-4:] == ["AWAITING_HITL", "EXECUTING", "TRACING", "SUCCEEDED"]
    assert purges(call_log) == [f"{run_id}:b"]  # the approved step, once
    step_c = result.artifacts["c"]
    assert step_c["port"] == port and step_c["body"] == "hello" and step_c["restarted"] is instance_killed
    assert step_c["generation"] == (2 if instance_killed else 1)
    assert_one_instance_served_then_released(world, run_id, row, instance_killed)  # rounds 1 and 2


def _job(run_id: str, skill_id: str, workdir: Path) -> SandboxJob:
    return SandboxJob(skill_id=skill_id, function="probe", arguments={}, context={"run_id": run_id},
                      workdir=workdir, wall_s=5)


def test_pool_exhaustion_and_reclaim_after_sigkill(tmp_path: Path, call_log: Path) -> None:
    """With a pool of two ports held by two Runs' instances, a third Run's call waits out its step's
    limit and fails with sandbox_unavailable naming the pool (traced, never run unsandboxed); once one of
    the holders is SIGKILLed, the next call reclaims its port and runs."""
    need_bwrap()
    rt = build_runtime(instance_settings(tmp_path, sandbox_ports="45100-45101"))
    pool, sandbox = rt.tools.sandbox_pool, rt.tools.sandbox()
    assert pool is not None
    try:
        holders = []
        for n in range(2):
            run_id = rt.runs.submit({"task": f"hold {n}", **TESTER})[0].run_id
            workdir = rt.tools.workdirs.ensure(run_id)
            holders.append(pool.lease(sandbox, _job(run_id, "test.devserver", workdir), tenant_id="t1",
                                      user_id="tess", persistent=True, ports=1, deadline=time.monotonic() + 5))
        assert sorted(p for h in holders for p in h.row.ports) == [45100, 45101]
        with pytest.raises(SandboxUnavailableError, match="port pool"):
            pool.lease(sandbox, _job("r-extra", "test.devserver", tmp_path), tenant_id="t1", user_id="tess",
                       persistent=True, ports=1, deadline=time.monotonic() + 0.2)

        refused = rt.runs.create_run({"task": "quickly serve refused", **TESTER})
        assert refused.state == "CLOSED_FAILED" and "sandbox_unavailable" in (refused.error or ""), refused
        assert "the host's port pool (2 ports, 45100-45101) is fully in use" in (refused.error or "")
        assert [n for n, _ in events(rt, refused.run_id)] == ["sandbox_unavailable"]
        assert pool.table.get(refused.run_id, "test.devserver_quick") is None  # nothing ran, no instance

        os.kill(holders[0].holder.pid or 0, signal.SIGKILL)
        eventually(lambda: not alive(holders[0].holder), "the SIGKILLed instance is gone")
        served = rt.runs.create_run({"task": "serve again", **TESTER})
        assert served.state == "SUCCEEDED", served
        assert served.artifacts["a"]["port"] == holders[0].row.ports[0]  # the dead instance's port, reclaimed
        reclaimed = events(rt, holders[0].row.run_id)
        assert [(n, d["reason"]) for n, d in reclaimed if n == "sandbox_instance_reclaimed"] == \
            [("sandbox_instance_reclaimed", "its process was gone")]
        assert instance_of(rt, holders[0].row.run_id).state == DEAD
        assert instance_of(rt, served.run_id).state == RELEASED
    finally:
        for row in pool.table.live():
            pool.table.end_now(row, DEAD, "the test ended", rt.store.clock.now())
        pool.stop_ended()
        rt.close()


def _cli(tmp_path: Path, call_log: Path, task: str, **env: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "HARNESS_SKILLS_DIRS": str(tmp_path / "skills"),
               "HARNESS_LLM_RULES": str(tmp_path / "rules.yaml"),
               "HARNESS_POLICY_FILE": str(Path(__file__).resolve().parents[1] / "fixtures" / "policy.yaml"),
               "HARNESS_IDENTITIES": str(Path(__file__).resolve().parents[1] / "fixtures" / "identities.yaml"),
               "HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_TEST_CALL_LOG": str(call_log), **env}
    return subprocess.Popen([str(Path(sys.executable).parent / "harness"), "run", task, "--tenant", "t1",
                             "--user", "tess", "--db", str(tmp_path / "rt.db"), "--json"], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_caps_are_hit_under_concurrent_runs(tmp_path: Path, call_log: Path) -> None:
    """Tenant cap 2, host cap 3: two Runs of tenant t1 in two `harness run` processes and one of t2 here
    hold the host's three instances. Then a t1 Run fails naming its tenant's cap and a t2 Run fails
    naming the host's, each after waiting out its step's limit, traced. Once the holders close, a new Run
    gets an instance. No more than three are ever live."""
    caps: dict[str, Any] = {"sandbox_tenant_cap": 2, "sandbox_host_cap": 3}
    rt = build_runtime(instance_settings(tmp_path, sandbox="rlimit", **caps))
    env = {"HARNESS_SANDBOX": "rlimit", "HARNESS_SANDBOX_TENANT_CAP": "2", "HARNESS_SANDBOX_HOST_CAP": "3"}
    release, other = tmp_path / "release", {"tenant_id": "t2", "user_id": "mallory", "roles": ["tester"]}
    pool = rt.tools.sandbox_pool
    assert pool is not None
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], len(pool.table.live()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(3) as threads:
        try:
            holders = [_cli(tmp_path, call_log, f"hold until {release}", **env) for _ in range(2)]
            eventually(lambda: len(pool.table.live()) == 2, "both t1 holders have an instance")
            third = threads.submit(rt.runs.create_run, {"task": f"hold until {release}", **other})
            eventually(lambda: len(pool.table.live()) == 3, "the t2 holder has an instance")
            refused = [threads.submit(rt.runs.create_run, {"task": f"briefly hold until {release}", **who})
                       for who in (TESTER, other)]
            results = [f.result(timeout=60) for f in refused]
        finally:
            release.touch()
        done = [h.communicate(timeout=120) for h in holders]
        held = [json.loads(out)["state"] for out, _ in done] + [third.result(timeout=60).state]
    stop.set()
    watcher.join()
    assert held == ["SUCCEEDED"] * 3, done
    assert peak[0] == 3
    names = ("tenant t1's instance cap (2)", "the host's instance cap (3)")
    for result, name in zip(results, names, strict=True):
        assert result.state == "CLOSED_FAILED", result
        expected = f"sandbox_unavailable: step a: no sandbox for test.hold_short: {name} is fully in use"
        assert expected in (result.error or "")
        ((event, detail),) = events(rt, result.run_id)
        assert event == "sandbox_unavailable" and detail["resource"] == name
    assert pool.table.live() == []
    after = rt.runs.create_run({"task": f"briefly hold until {release}", **TESTER})
    assert after.state == "SUCCEEDED", after
    rt.close()


def test_a_bad_port_range_is_named() -> None:
    """A port range that is not LOW-HIGH within 1024-65535 is refused naming the setting."""
    for bad in ("lots", "70000-70010", "5000-4000"):
        with pytest.raises(InvalidRequestError, match="sandbox_ports"):
            Settings.from_env(sandbox_ports=bad)
