"""A Run taken over from a driver whose lease lapsed (it died or was stopped) leaves an audit event naming
both drivers; a lease taken while free, or again by its own holder, leaves none."""

from __future__ import annotations

from pathlib import Path

from harness.adapters.sql.leases import Leases
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.drive.worker import RunWorker
from tests.integration.test_worker import TESS, _kill_during_call, settings


def test_a_takeover_names_both_drivers(backend_url: str, tmp_path: Path, clock: FakeClock) -> None:
    """w2 taking w1's lapsed lease writes lease_taken_over (w1 → w2) in the acquire's transaction; a free
    lease, and the holder's own renewal by acquire, write nothing."""
    rt = build_runtime(settings(tmp_path, backend_url), clock=clock)
    try:
        run, _ = rt.runs.submit({"task": "echo hi", **TESS})
        store = rt.store
        assert isinstance(store, SqlStore)
        leases = Leases(store, ttl_s=10)
        first = leases.acquire(run.run_id, "w1")
        assert first is not None and leases.acquire(run.run_id, "w1") is not None
        assert leases.acquire(run.run_id, "w2") is None  # still w1's
        assert store.audit_events(event="lease_taken_over") == []
        clock.advance(11)
        taken = leases.acquire(run.run_id, "w2")
        assert taken is not None
        events = store.audit_events(event="lease_taken_over")
        assert [(e.run_id, e.actor, e.detail["previous_driver"], e.detail["driver"]) for e in events] == [
            (run.run_id, "w2", "w1", "w2")]
        leases.release(taken)
        assert leases.acquire(run.run_id, "w3") is not None  # free: no takeover
        assert len(store.audit_events(event="lease_taken_over")) == 1
    finally:
        rt.close()


def test_a_worker_killed_mid_call_is_named_by_its_successor(tmp_path: Path, call_log: Path) -> None:
    """A worker process SIGKILLed inside a call: the rescuer's takeover is audited with the dead worker's
    name and its own."""
    run_id = _kill_during_call(tmp_path, call_log, "hang 30")
    rt = build_runtime(settings(tmp_path))
    try:
        RunWorker(rt, owner="rescuer").execute(run_id)
        events = [e for e in rt.store.audit_events(event="lease_taken_over") if e.run_id == run_id]
        assert len(events) == 1
        detail = events[0].detail
        assert detail["driver"].startswith("rescuer") and detail["previous_driver"].startswith("doomed")
    finally:
        rt.close()
