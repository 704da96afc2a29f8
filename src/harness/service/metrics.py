"""Prometheus metrics (SPEC U2): database gauges computed at scrape time, counters of this process.

Gauges read the database, so they are true for every process sharing it: Runs by state, stuck
(zombie) Runs by state against kernel.thresholds, trace backlog, pending approvals and their wait,
the cancel ratio among closed Runs, live sandbox instances and leased ports. Counters count what this
process saw: transitions applied, HTTP requests, and how long decided approvals had waited.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from harness.domain.sandbox import PoolSettings
from harness.kernel.states import FINAL, RunState
from harness.kernel.thresholds import DEFAULT, Thresholds
from harness.operations import Operations
from harness.pipeline.waits import Lane
from harness.stores import webhook_outbox

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, float("inf"))


class DatabaseCollector(Collector):
    """Gauges computed from the database at each scrape."""

    def __init__(self, ops: Operations, thresholds: Thresholds = DEFAULT,
                 sandboxes: PoolSettings | None = None) -> None:
        self.ops = ops
        self.reads = ops.reads
        self.thresholds = thresholds
        self.ledger = ops.ledger
        self.outbox = webhook_outbox(ops.store)
        self.instances = ops.sandbox_instances()
        self.sandboxes = sandboxes

    def _sandboxes(self) -> Iterator[Metric]:
        """Live sandbox instances and leased ports, from the database (every host's), and this host's
        capacity (its caps and the size of its port pool)."""
        use = self.instances.use()
        live = GaugeMetricFamily("harness_sandbox_instances", "Live sandbox instances by host.", labels=["host"])
        for host, n in sorted(use.live_by_host.items()):
            live.add_metric([host], n)
        yield live
        tenants = GaugeMetricFamily("harness_sandbox_instances_by_tenant", "Live sandbox instances by tenant.",
                                    labels=["tenant"])
        for tenant, n in sorted(use.live_by_tenant.items()):
            tenants.add_metric([tenant], n)
        yield tenants
        ports = GaugeMetricFamily("harness_sandbox_ports_leased", "Ports of the pool leased to live instances.",
                                  labels=["host"])
        for host, n in sorted(use.ports_by_host.items()):
            ports.add_metric([host], n)
        yield ports
        if self.sandboxes is not None:
            low, high = self.sandboxes.port_range or (1, 0)
            here = [self.sandboxes.host]
            pool = GaugeMetricFamily("harness_sandbox_ports", "Ports in this host's pool.", labels=["host"])
            pool.add_metric(here, high - low + 1)
            caps = GaugeMetricFamily("harness_sandbox_instance_cap", "Instances allowed at once, per host and per "
                                     "tenant.", labels=["host", "scope"])
            caps.add_metric([*here, "host"], self.sandboxes.host_cap)
            caps.add_metric([*here, "tenant"], self.sandboxes.tenant_cap)
            yield from (pool, caps)

    def _costs(self) -> Iterator[Metric]:
        """Recorded spend by tenant and skill (planning calls as "(planning)"), from the costs table: true
        for every process that records costs, not only this one."""
        families = {
            "usd": CounterMetricFamily("harness_cost_usd", "USD recorded.", labels=["tenant", "skill"]),
            "input_tokens": CounterMetricFamily("harness_cost_input_tokens", "Input tokens recorded.",
                                                labels=["tenant", "skill"]),
            "output_tokens": CounterMetricFamily("harness_cost_output_tokens", "Output tokens recorded.",
                                                 labels=["tenant", "skill"]),
            "api_calls": CounterMetricFamily("harness_cost_api_calls", "Model API calls recorded.",
                                             labels=["tenant", "skill"]),
            "sandbox_s": CounterMetricFamily("harness_cost_sandbox_seconds", "Sandboxed seconds recorded.",
                                             labels=["tenant", "skill"]),
            "unpriced": CounterMetricFamily("harness_cost_unpriced_calls", "Calls of models without a price.",
                                            labels=["tenant", "skill"]),
        }
        for tenant, skill, sums in self.ledger.by_tenant_and_skill():
            for name, family in families.items():
                family.add_metric([tenant, skill], float(getattr(sums, name)))
        yield from families.values()

    def collect(self) -> Iterator[Metric]:
        """The gauges, freshly read."""
        yield from self._costs()
        yield from self._sandboxes()
        deliveries = GaugeMetricFamily("harness_webhook_deliveries", "Webhook deliveries in each status.",
                                       labels=["status"])
        for status, n in self.outbox.counts().items():
            deliveries.add_metric([status], n)
        yield deliveries
        now = self.ops.clock.now()
        by_state = self.reads.runs_by_state()
        runs = GaugeMetricFamily("harness_runs", "Runs currently in each state.", labels=["state"])
        for state, n in by_state.items():
            runs.add_metric([state], n)
        yield runs
        zombies = GaugeMetricFamily(
            "harness_zombie_runs", "Runs whose state outlived its threshold.", labels=["state"]
        )
        for state, n in self.reads.zombie_counts(now, self.thresholds).items():
            zombies.add_metric([state], n)
        yield zombies
        yield GaugeMetricFamily(
            "harness_trace_backlog",
            "Trace records waiting in the outbox to be chained.",
            value=self.ops.trace_backlog(),
        )
        pending, oldest = self.reads.pending_approvals()
        yield GaugeMetricFamily(
            "harness_hitl_pending", "Approval requests waiting for a human.", value=pending
        )
        yield GaugeMetricFamily(
            "harness_hitl_oldest_wait_seconds",
            "How long the oldest pending request has waited.",
            value=max(now - oldest, 0.0) if oldest is not None else 0.0,
        )
        closed = sum(by_state[s.value] for s in FINAL)
        yield GaugeMetricFamily(
            "harness_cancel_ratio",
            "Share of closed Runs that were cancelled.",
            value=by_state[RunState.CLOSED_CANCELLED.value] / closed if closed else 0.0,
        )


class DriveLoad(Protocol):
    """What the drive gauges read of the embedded worker."""

    @property
    def driving(self) -> int: ...

    @property
    def in_flight(self) -> int: ...


class DriveCollector(Collector):
    """This process's drives and lanes, read at each scrape: Runs being driven (waiting ones included),
    Runs queued here for a place, and the calls running on and waiting for each lane's threads."""

    def __init__(self, worker: DriveLoad, lanes: Sequence[Lane]) -> None:
        self.worker = worker
        self.lanes = lanes

    def collect(self) -> Iterator[Metric]:
        driving = self.worker.driving
        yield GaugeMetricFamily("harness_drives", "Runs this process drives now, waiting ones included.",
                                value=driving)
        yield GaugeMetricFamily("harness_drives_queued", "Runs queued in this process for a place to be driven.",
                                value=max(self.worker.in_flight - driving, 0))
        running = GaugeMetricFamily("harness_lane_calls_running", "Calls running on a lane's threads.",
                                    labels=["lane"])
        queued = GaugeMetricFamily("harness_lane_calls_queued", "Calls waiting for one of a lane's threads.",
                                   labels=["lane"])
        for lane in self.lanes:
            running.add_metric([lane.name], lane.running)
            queued.add_metric([lane.name], lane.queued)
        yield running
        yield queued


class Metrics:
    """This service's metrics registry (one per app, so tests and several apps do not collide)."""

    def __init__(self, ops: Operations, thresholds: Thresholds = DEFAULT,
                 sandboxes: PoolSettings | None = None) -> None:
        self.registry = CollectorRegistry()
        self.transitions = Counter(
            "harness_transitions",
            "State changes applied by this process.",
            ["from_state", "to_state"],
            registry=self.registry,
        )
        self.requests = Histogram(
            "harness_http_request_duration_seconds",
            "HTTP requests by route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.hitl_wait = Histogram(
            "harness_hitl_decision_wait_seconds",
            "How long approval requests waited before a decision closed them.",
            ["outcome"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(DatabaseCollector(ops, thresholds, sandboxes))

    def watch_drives(self, worker: DriveLoad, lanes: Sequence[Lane]) -> None:
        """Add the gauges of this process's drives and lanes."""
        self.registry.register(DriveCollector(worker, lanes))

    def on_transition(self, _run_id: str, source: RunState, target: RunState) -> None:
        """State machine listener."""
        self.transitions.labels(source.value, target.value).inc()

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
