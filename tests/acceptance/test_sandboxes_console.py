"""The sandboxes in use, as people and monitoring see them: the console's sandboxes page (the tenant's live
instances, this host's caps and port pool) and the Prometheus gauges; an instance is gone from both once
its Run closes."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from harness.adapters.sandbox.rlimit import RlimitSandbox
from harness.config import Runtime
from harness.domain.sandbox import SandboxJob
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    REFUND_L3,
    client_fixture,
    create,
    key,
    runtime_fixture,
)
from tests.acceptance.test_api_console import _sign_in


def _gauge(text: str, name: str, labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_console_and_metrics_show_live_instances_and_pool_use(client: TestClient, runtime: Runtime) -> None:
    """A Run waiting for approval that holds an instance with two leased ports is listed on the tenant's
    sandboxes page and counted by the gauges; once the Run is cancelled, the instance and its ports are
    given back and both show it."""
    waiting = create(client, REFUND_L3)
    run = runtime.store.get_run(waiting["run_id"])
    pool = runtime.tools.sandbox_pool
    assert pool is not None
    workdir = runtime.tools.workdirs.ensure(run.run_id)
    job = SandboxJob(skill_id="shell.exec", function="run", arguments={}, context={"run_id": run.run_id},
                     workdir=workdir, wall_s=5)
    lease = pool.lease(RlimitSandbox(warn=False), job, tenant_id=run.tenant_id, user_id=run.user_id,
                       persistent=True, ports=2, deadline=time.monotonic() + 5)
    host = runtime.settings.sandbox_host
    _sign_in(client, "alice")
    page = client.get("/ui/sandboxes").text
    assert f'data-instance-run="{run.run_id}"' in page and "shell.exec" in page
    assert ", ".join(map(str, lease.row.ports)) in page
    assert 'data-testid="host-live">1<' in page and 'data-testid="ports-leased">2<' in page
    assert 'data-testid="tenant-live">1<' in page and "41000-41255" in page
    metrics = client.get("/metrics", headers=key("operator")).text
    assert _gauge(metrics, "harness_sandbox_instances", f'host="{host}"') == 1
    assert _gauge(metrics, "harness_sandbox_ports_leased", f'host="{host}"') == 2
    assert _gauge(metrics, "harness_sandbox_ports", f'host="{host}"') == 256
    assert _gauge(metrics, "harness_sandbox_instances_by_tenant", f'tenant="{run.tenant_id}"') == 1

    cancelled = client.post(f"/api/v1/runs/{run.run_id}/cancel", headers=key("alice"))
    assert cancelled.status_code == 200, cancelled.text
    page = client.get("/ui/sandboxes").text
    assert "No sandbox instances are live for your tenant." in page and 'data-testid="ports-leased">0<' in page
    metrics = client.get("/metrics", headers=key("operator")).text
    assert _gauge(metrics, "harness_sandbox_instances", f'host="{host}"') is None
    released = [e for e in runtime.store.audit_events(run_id=run.run_id) if e.event == "sandbox_instance_released"]
    assert [e.detail["ports"] for e in released] == [list(lease.row.ports)]
