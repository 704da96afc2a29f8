"""The remote sandbox provider's client: the sandbox port over HTTP to `harness sandbox serve`.

A call's failure stays in its outcome, as the port has it: a server that is down, too slow or refuses the
token gives an outcome `sandbox_unavailable` naming the server, never a hang (connect within
CONNECT_TIMEOUT_S; a call may take its wall time plus GRACE_S). An instance that cannot start raises, as
the local sandbox's does (the pool gives the call `sandbox_unavailable`).

Each call carries the skill's code (an archive the server keeps by its digest: sent once per server) and
the Run's files the server's copy lacks; the files the call changed come back into the Run's working
directory here (harness.adapters.sandbox.shipping). Code or files past the transfer bound fail the call
`sandbox_transfer_limit`, naming what was too large.
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness.adapters.sandbox.shipping import (
    HARNESS,
    HARNESS_ROOT,
    TransferError,
    TransferLimitError,
    code_roots,
    code_signature,
    harness_package,
    manifest,
    pack_code,
    read_files,
    write_files,
)
from harness.adapters.sandbox.wire import holder_from_json, holder_to_json, job_to_json, outcome_from_json
from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome

log = logging.getLogger("harness.sandbox.remote")
CONNECT_TIMEOUT_S = 5.0
#: what a call may take beyond its wall time (the server's process start, the transfer)
GRACE_S = 30.0


#: Runs whose files the client remembers the server to hold, at most (the oldest are forgotten: their
#: next call sends all their files)
MIRRORED_RUNS = 10_000


class RemoteSandboxError(RuntimeError):
    """The sandbox server could not be reached, refused the request, or answered with an error."""


class MissingOnServerError(RemoteSandboxError):
    """The server lacks the code or the files the request counted on ("code" or "files")."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class RemoteSandbox:
    """Runs sandboxed skills on a sandbox server (`harness sandbox serve`) at `url`."""

    provider = "remote"

    def __init__(self, url: str, token: str, *, transport: httpx.BaseTransport | None = None) -> None:
        if not url:
            raise ValueError("the remote sandbox needs a server URL (HARNESS_SANDBOX_URL)")
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                    timeout=httpx.Timeout(GRACE_S, connect=CONNECT_TIMEOUT_S), transport=transport)
        self._own = harness_package()
        self._lock = threading.Lock()
        #: code archives by what they were packed from (files, sizes, times), and those the server has
        self._packed: dict[tuple[tuple[str, int, int], ...], tuple[str, bytes]] = {}
        self._shipped: set[str] = set()
        #: each Run's files as the server last had them
        self._mirror: dict[str, dict[str, str]] = {}

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
        return self._call("/v1/run", job, lambda shipped: shipped)

    def start_instance(self, job: SandboxJob) -> Holder:
        """Start a kept instance on the server; raises RemoteSandboxError when it could not (or its code or
        files are too large to send)."""
        try:
            answer = self._shipping(job, lambda shipped: shipped,
                                    lambda body: self._request("POST", "/v1/instances", body, timeout=GRACE_S))
        except TransferError as exc:
            raise RemoteSandboxError(str(exc)) from None
        return holder_from_json(answer)

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        """Run one call inside a kept instance on the server."""
        return self._call("/v1/instances/run", job, lambda shipped: {"holder": holder_to_json(holder), "job": shipped})

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

    def _call(self, path: str, job: SandboxJob, wrap: Callable[[dict[str, Any]], dict[str, Any]]) -> SandboxOutcome:
        isolation = self.__dict__.get("isolation", "unknown")
        try:
            answer = self._shipping(job, wrap, lambda body: self._request("POST", path, body,
                                                                           timeout=job.wall_s + GRACE_S))
        except RemoteSandboxError as exc:
            return SandboxOutcome(ok=False, isolation=isolation, error_code="sandbox_unavailable", message=str(exc),
                                  retryable=True)
        except TransferError as exc:
            code = "sandbox_transfer_limit" if isinstance(exc, TransferLimitError) else "sandbox_transfer_error"
            return SandboxOutcome(ok=False, isolation=isolation, error_code=code, message=str(exc))
        files = answer.get("files")
        if isinstance(files, dict):
            write_files(job.workdir, files.get("changed") or {}, files.get("deleted") or ())
            self._remember(job.run_id, files.get("manifest") or {})
        return outcome_from_json(answer)

    def _shipping(self, job: SandboxJob, wrap: Callable[[dict[str, Any]], dict[str, Any]],
                  send: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Send the job with its code and files; once more with all of them when the server lacked some."""
        body = self._job(job)
        try:
            answer = send(wrap(body))
        except MissingOnServerError:
            answer = send(wrap(self._job(job, everything=True)))
        if "code" in body:
            with self._lock:
                self._shipped.add(body["code"]["digest"])
        return answer

    def _job(self, job: SandboxJob, *, everything: bool = False) -> dict[str, Any]:
        """The job as JSON with the harness package named as the wire names it, its code (the archive only
        when the server may lack it) and the Run's files the server lacks (`everything`: the archive and all
        the files, whatever the server was known to hold)."""
        body = job_to_json(job)
        own = self._own
        body["code_paths"] = [HARNESS if Path(p).resolve() == own else str(Path(p).resolve()) for p in job.code_paths]
        body["python_path"] = [HARNESS_ROOT if Path(p).resolve() == own.parent else str(Path(p).resolve())
                               for p in job.python_path]
        if job.entry_file is not None:
            body["entry_file"] = str(job.entry_file.resolve())
        roots = code_roots(job.entry_file, job.code_paths, own)
        if roots:
            digest, archive = self._archive(roots)
            with self._lock:
                if everything:
                    self._shipped.discard(digest)
                shipped = digest in self._shipped
            body["code"] = {"digest": digest, "roots": [str(r) for r in roots]}
            if not shipped:
                body["code"]["archive"] = base64.b64encode(archive).decode()
        here = manifest(job.workdir)
        with self._lock:
            known = {} if everything else self._mirror.get(job.run_id, {})
        body["files"] = {"manifest": here,
                         "send": read_files(job.workdir, [n for n, d in here.items() if known.get(n) != d])}
        return body

    def _archive(self, roots: list[Path]) -> tuple[str, bytes]:
        """The code archive of the roots, packed again only when one of their files changed."""
        key = code_signature(roots)
        with self._lock:
            packed = self._packed.get(key)
        if packed is None:
            packed = pack_code(roots)
            with self._lock:
                if len(self._packed) > 64:
                    self._packed.clear()
                self._packed[key] = packed
        return packed

    def _remember(self, run_id: str, files: dict[str, str]) -> None:
        with self._lock:
            if len(self._mirror) >= MIRRORED_RUNS:
                self._mirror.pop(next(iter(self._mirror)))
            self._mirror[run_id] = dict(files)

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
        if response.status_code == 409 and isinstance(value, dict) and value.get("missing") in ("code", "files"):
            raise MissingOnServerError(str(value["missing"]), str(value.get("error")))
        if response.status_code != 200 or not isinstance(value, dict):
            error = value.get("error") if isinstance(value, dict) else response.text[:300]
            raise RemoteSandboxError(f"the sandbox server at {self.url} answered {response.status_code}: {error}")
        return value
