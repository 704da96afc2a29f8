"""The service object every route reaches through `request.app.state.service`, and tenant-scoped lookups."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from harness.domain.approvals import HitlRequest
from harness.domain.errors import UnknownRunError
from harness.domain.records import RunRecord
from harness.domain.retention import ArchivedRun
from harness.operations import Operations
from harness.policy.hitl import UnknownRequestError
from harness.service.auth import Authenticator, Principal
from harness.service.errors import ApiError, not_found
from harness.service.metrics import Metrics
from harness.service.schemas import archived_json
from harness.service.settings import ServiceSettings
from harness.service.sse import ChangeHub
from harness.service.telemetry import Telemetry
from harness.service.worker import EmbeddedWorker
from harness.webhooks.delivery import DeliveryThread


@dataclass
class Service:
    """What one service process holds: the operator's API over its runtime, and the parts the HTTP layer adds
    around it."""

    ops: Operations
    settings: ServiceSettings
    auth: Authenticator
    worker: EmbeddedWorker
    hub: ChangeHub
    metrics: Metrics
    telemetry: Telemetry | None = None
    owns_runtime: bool = True
    #: the embedded webhook delivery loop (SPEC P4 / N1); None when turned off
    deliveries: DeliveryThread | None = None
    stopping: bool = field(default=False)

    def owned_run(self, caller: Principal, run_id: str) -> RunRecord:
        """The caller's tenant's Run with this id; 404 for an unknown id and another tenant's Run alike."""
        try:
            run = self.ops.run(run_id)
        except UnknownRunError:
            archived = self.ops.archived(run_id)
            if archived is not None and archived.tenant_id == caller.tenant_id:
                raise ApiError(410, "archived", f"run {run_id!r} was archived and pruned from the database: it is "
                               f"in segment {archived.segment_id} at {archived.location}",
                               extra={"archived": archived_json(archived)}) from None
            raise not_found("run", run_id) from None
        if run.tenant_id != caller.tenant_id:
            raise not_found("run", run_id)
        return run

    def owned_archived(self, caller: Principal, run_id: str) -> ArchivedRun | None:
        """Where the caller's tenant's archived Run with this id is; None when there is no such Run."""
        archived = self.ops.archived(run_id)
        return archived if archived is not None and archived.tenant_id == caller.tenant_id else None

    def owned_request(self, caller: Principal, request_id: str) -> HitlRequest:
        """The caller's tenant's approval request with this id; 404 otherwise."""
        try:
            return self.ops.approval(request_id, caller.tenant_id)
        except UnknownRequestError:
            raise not_found("approval request", request_id) from None


def service_of(request: Request) -> Service:
    """The service serving this request."""
    svc: Service = request.app.state.service
    return svc
