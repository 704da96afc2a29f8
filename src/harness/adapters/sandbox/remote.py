"""The remote sandbox provider's client: the sandbox port over HTTP to `harness sandbox serve`.

A call's failure stays in its outcome, as the port has it: a server that is down, too slow or refuses the
token gives an outcome `sandbox_unavailable` naming the server, never a hang (connect within
CONNECT_TIMEOUT_S; a call may take its wall time plus GRACE_S). An instance that cannot start raises, as
the local sandbox's does (the pool gives the call `sandbox_unavailable`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import httpx

from harness.adapters.sandbox.wire import holder_from_json, holder_to_json, job_to_json, outcome_from_json
from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome

log = logging.getLogger("harness.sandbox.remote")
CONNECT_TIMEOUT_S = 5.0
#: what a call may take beyond its wall time (the server's process start, the transfer)
GRACE_S = 30.0


class RemoteSandboxError(RuntimeError):
    """The sandbox server could not be reached, refused the request, or answered with an error."""


class RemoteSandbox:
    """Runs sandboxed skills on a sandbox server (`harness sandbox serve`) at `url`."""

    provider = "remote"

    def __init__(self, url: str, token: str, *, transport: httpx.BaseTransport | None = None) -> None:
        if not url:
            raise ValueError("the remote sandbox needs a server URL (HARNESS_SANDBOX_URL)")
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                    timeout=httpx.Timeout(GRACE_S, connect=CONNECT_TIMEOUT_S), transport=transport)

    @functools.cached_property
    def isolation(self) -> str:
        """How strong the server's walls are ("bwrap"), asked once; "unknown" while it cannot be reached."""
        try:
            return str(self._request("GET", "/v1/sandbox")["isolation"])
        except RemoteSandboxError:
            self.__dict__.pop("isolation", None)
            return "unknown"

    def run(self, job: SandboxJob) -> SandboxOutcome:
        """Run one call on the server; its failure (or the server's) is described in the outcome."""
        return self._call("/v1/run", job_to_json(job), job)

    def start_instance(self, job: SandboxJob) -> Holder:
        """Start a kept instance on the server; raises RemoteSandboxError when it could not."""
        return holder_from_json(self._request("POST", "/v1/instances", job_to_json(job), timeout=GRACE_S))

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        """Run one call inside a kept instance on the server."""
        return self._call("/v1/instances/run", {"holder": holder_to_json(holder), "job": job_to_json(job)}, job)

    def alive(self, holder: Holder) -> bool:
        """Whether the instance's process on the server still runs (ports.sandboxes.InstanceProcesses): False
        also while the server cannot be reached, so the next call re-creates the instance there (or fails
        naming the server) and a sweep ends it; its process is stopped once the server answers again."""
        try:
            return bool(self._request("POST", "/v1/instances/alive", holder_to_json(holder))["alive"])
        except RemoteSandboxError as exc:
            log.warning("cannot ask whether a sandbox instance runs: %s", exc)
            return False

    def stop(self, holder: Holder) -> bool:
        """Kill the instance's process on the server; True when it is gone, False while the server cannot
        be reached (the sweeper asks again)."""
        try:
            return bool(self._request("POST", "/v1/instances/stop", holder_to_json(holder))["stopped"])
        except RemoteSandboxError as exc:
            log.warning("cannot stop a sandbox instance: %s", exc)
            return False

    def close(self) -> None:
        """Close the connections to the server."""
        self._client.close()

    def _call(self, path: str, body: dict[str, Any], job: SandboxJob) -> SandboxOutcome:
        try:
            answer = self._request("POST", path, body, timeout=job.wall_s + GRACE_S)
        except RemoteSandboxError as exc:
            return SandboxOutcome(ok=False, isolation=self.__dict__.get("isolation", "unknown"),
                                  error_code="sandbox_unavailable", message=str(exc), retryable=True)
        return outcome_from_json(answer)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 timeout: float | None = None) -> dict[str, Any]:
        extra: dict[str, Any] = {} if timeout is None else {
            "timeout": httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)}
        try:
            response = self._client.request(method, path, json=body, **extra)
        except httpx.TimeoutException as exc:
            raise RemoteSandboxError(f"the sandbox server at {self.url} did not answer in time ({exc!r})") from None
        except httpx.HTTPError as exc:
            raise RemoteSandboxError(f"the sandbox server at {self.url} cannot be reached: {exc}") from None
        if response.status_code == 401:
            raise RemoteSandboxError(f"the sandbox server at {self.url} refused the token (401)")
        try:
            value = response.json()
        except ValueError:
            value = None
        if response.status_code != 200 or not isinstance(value, dict):
            error = value.get("error") if isinstance(value, dict) else response.text[:300]
            raise RemoteSandboxError(f"the sandbox server at {self.url} answered {response.status_code}: {error}")
        return value
