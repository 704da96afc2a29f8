"""A drive's lease: renewed while the Run is driven, from one scheduling thread per process (every held
lease every third of its time to live, none once its drive has stopped, a renewal that waits holding up
no other Run's, a lease taken over marked lost), and taken only while the Run has something to drive
(on every backend, real leases, real time)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.leases import Leases
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.errors import UnknownRunError
from harness.domain.leases import Lease
from harness.domain.records import NewRun
from harness.drive.leased import Fence, Heartbeats
from harness.drive.state_machine import StateMachine
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.pipeline import waits
from harness.pipeline.waits import Lane
from tests.integration.test_child_runs import eventually
from tests.integration.test_commit_boundaries import PLAIN, _example

S = RunState
TTL = 0.3  # a beat every 0.1 s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(backend_url: str, clock: FakeClock) -> Iterator[SqlStore]:
    s = SqlStore.open(backend_url, clock)
    yield s
    s.close()


def _held(store: SqlStore, leases: Leases, owner: str) -> Fence:
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    lease = leases.acquire(run.run_id, owner)
    assert lease is not None
    return Fence(lease, leases)


def _expires(store: SqlStore, run_id: str) -> float:
    with store.engine.connect() as conn:
        value = conn.execute(sa.select(t.runs.c.lease_expires_at).where(t.runs.c.run_id == run_id)).scalar()
    return float(value) if value is not None else 0.0


def test_every_held_lease_is_renewed_and_none_once_stopped(store: SqlStore, clock: FakeClock) -> None:
    leases = Leases(store, ttl_s=TTL)
    heartbeats = Heartbeats()
    fences = [_held(store, leases, f"w{i}") for i in range(3)]
    beats = [heartbeats.hold(fence) for fence in fences]
    clock.advance(1000)  # every lease has lapsed on the database's clock: only a renewal brings it back
    eventually(lambda: all(_expires(store, f.lease.run_id) > clock.now() for f in fences),
               "every held lease renewed", timeout_s=5)
    assert all(leases.holds(f.lease) and not f.lost for f in fences)
    assert all(f.lease.expires_at > clock.now() for f in fences)  # the fence carries the renewed lease
    for beat in beats:
        heartbeats.stop(beat)
        heartbeats.wait(beat)
    clock.advance(1000)
    time.sleep(5 * TTL / 3)  # five beats' time: none is made
    assert all(_expires(store, f.lease.run_id) < clock.now() for f in fences)


class _Stuck(Leases):
    """Real leases whose renewals of one Run wait until let go (a row held, a database away)."""

    def __init__(self, store: SqlStore, stuck_run: str) -> None:
        super().__init__(store, ttl_s=TTL)
        self.stuck_run = stuck_run
        self.go = threading.Event()
        self.tries: dict[str, int] = {}

    def heartbeat(self, lease: Lease, *, waiting: bool = False) -> Lease | None:
        self.tries[lease.run_id] = self.tries.get(lease.run_id, 0) + 1
        if lease.run_id == self.stuck_run:
            self.go.wait(30)
        return super().heartbeat(lease, waiting=waiting)


def test_a_renewal_that_waits_holds_up_no_other_run(store: SqlStore, clock: FakeClock) -> None:
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    leases = _Stuck(store, run.run_id)
    stuck = Fence(leases.acquire(run.run_id, "w1") or pytest.fail("no lease"), leases)
    other = _held(store, leases, "w2")
    heartbeats = Heartbeats()
    beats = [heartbeats.hold(stuck), heartbeats.hold(other)]
    clock.advance(1000)
    eventually(lambda: _expires(store, other.lease.run_id) > clock.now(), "the other Run's lease renewed",
               timeout_s=5)
    eventually(lambda: leases.tries.get(other.lease.run_id, 0) >= 5, "five renewals of the other Run",
               timeout_s=5)
    assert leases.tries[run.run_id] == 1  # the next beat of a Run waits for its renewal under way
    assert _expires(store, run.run_id) < clock.now()
    for beat in beats:
        heartbeats.stop(beat)
    leases.go.set()
    for beat in beats:
        heartbeats.wait(beat)
    assert _expires(store, run.run_id) > clock.now()  # the renewal under way was let finish


def test_a_lease_taken_over_is_lost_and_renewed_no_more(store: SqlStore, clock: FakeClock,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    leases = Leases(store, ttl_s=TTL)
    fence = _held(store, leases, "w1")
    heartbeats = Heartbeats()
    beat = heartbeats.hold(fence)
    thief = None
    for _ in range(50):  # the lease lapses on the database's clock; a renewal may win a round
        clock.advance(1000)
        thief = leases.acquire(fence.lease.run_id, "thief")
        if thief is not None:
            break
    assert thief is not None, "the lapsed lease was never taken over"
    eventually(lambda: fence.lost, "the fence marked lost", timeout_s=5)
    assert beat.stopped and "lost; this worker stops driving it" in caplog.text
    assert not fence.holds()
    heartbeats.wait(beat)
    assert leases.holds(thief)


def _steal(url: str, run_id: str, seconds: float, log: str) -> None:
    """Another worker process: tries to take the Run's lease all along, one line per try (1: it got it)."""
    store = SqlStore.open(url)
    try:
        leases, deadline = Leases(store, ttl_s=0.6), time.monotonic() + seconds
        with open(log, "a") as out:
            while time.monotonic() < deadline:
                out.write(f"{int(leases.acquire(run_id, 'thief') is not None)}\n")
                out.flush()
                time.sleep(0.05)
    finally:
        store.close()


def test_a_drive_longer_than_its_lease_keeps_it(backend_url: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A Run whose step outlasts the lease several times over is not taken from its worker: the
    heartbeats keep the lease, so a worker in another process trying all along never gets it, and the
    Run ends."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    log = tmp_path / "thief.log"
    try:
        run, _ = rt.runs.submit(PLAIN)

        def slow_step(run_id: str, _source: RunState, target: RunState) -> None:
            if run_id == run.run_id and target == RunState.EXECUTING:  # committed, before the first call
                thief = mp.get_context("spawn").Process(target=_steal,
                                                        args=(backend_url, run_id, 1.8, str(log)))
                thief.start()  # the step lasts the thief's start-up and its 1.8 s: over three leases
                thief.join(60)
                assert thief.exitcode == 0

        rt.machine.subscribe(slow_step)
        result = RunWorker(rt, owner="w1", ttl_s=0.6).execute(run.run_id)
        assert result is not None and result.state == "SUCCEEDED", result
        stolen = log.read_text().split()
        assert stolen and not any(int(x) for x in stolen)
        assert rt.store.get_run(run.run_id).lease_owner is None
    finally:
        rt.close()


def test_a_lease_to_drive_is_not_taken_on_a_run_with_nothing_to_drive(store: SqlStore) -> None:
    """A drive takes its lease with no read of the Run before it: the lease is refused outright when the
    Run is final or waits for a human, and such a Run's lease columns are left as they were."""
    machine = StateMachine(store)
    leases = Leases(store, ttl_s=60)
    closed, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    machine.transition(closed.run_id, S.CREATED, S.FAILED, actor="test", reason="closed")
    parked, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    for source, target in ((S.CREATED, S.PREPARING), (S.PREPARING, S.PLANNING), (S.PLANNING, S.POLICY_CHECK),
                           (S.POLICY_CHECK, S.AWAITING_HITL)):
        machine.transition(parked.run_id, source, target, actor="test", reason="on its way")
    assert store.get_run(closed.run_id).state == S.CLOSED_FAILED
    for run_id in (closed.run_id, parked.run_id, "no-such-run"):
        assert leases.acquire(run_id, "w1", to_drive=True) is None
    assert all(store.get_run(r).lease_epoch == 0 and store.get_run(r).lease_owner is None
               for r in (closed.run_id, parked.run_id))
    fresh, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    assert leases.acquire(fresh.run_id, "w1", to_drive=True) is not None
    assert leases.acquire(closed.run_id, "w1") is not None  # the plain acquire takes any Run's lease


def test_a_drive_of_a_final_run_answers_its_result_and_of_an_unknown_one_names_it(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    try:
        done = rt.runs.create_run(PLAIN)
        assert done.state == "SUCCEEDED"
        epoch = rt.store.get_run(done.run_id).lease_epoch
        again = RunWorker(rt, owner="w2").execute(done.run_id)
        assert again is not None and again.state == "SUCCEEDED" and again.run_id == done.run_id
        assert rt.store.get_run(done.run_id).lease_epoch == epoch  # no lease was taken
        with pytest.raises(UnknownRunError, match="no-such-run"):
            RunWorker(rt, owner="w2").execute("no-such-run")
    finally:
        rt.close()


def _waiting(store: SqlStore, run_id: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(t.runs.c.lease_waiting).where(t.runs.c.run_id == run_id)).scalar_one())


def _stalls_after_takeover(store: SqlStore, clock: FakeClock, leases: Leases, run_id: str) -> int:
    """The stall count a new worker finds when it takes over the Run's lapsed lease (its holder died)."""
    clock.advance(1000)
    lease = leases.acquire(run_id, "successor")
    assert lease is not None
    return lease.stalls


def test_a_death_while_the_drive_waits_outside_the_process_counts_no_stall(store: SqlStore,
                                                                           clock: FakeClock) -> None:
    """A drive switched out on a wait outside the process (a model's answer) has its row marked soon after
    it switches out, and clears the mark before it runs on; a takeover of a lease marked so counts no
    stall, one taken while the drive worked (or waited on its own process's code) counts one."""
    from harness.pipeline.drive_loop import DriveLoop

    leases = Leases(store, ttl_s=30)
    heartbeats = Heartbeats()
    loop = DriveLoop(concurrency=10, name="stalls")
    loop.start()
    local = Lane("local", 1, in_process=True)
    try:
        def drive(fence: Fence, wait: Callable[[], None], seen: list[int]) -> None:
            beat = heartbeats.hold(fence)
            with waits.watched(lambda out: heartbeats.switched(beat, out)):
                wait()
                seen.append(_waiting(store, fence.lease.run_id))  # as the drive runs on
            heartbeats.stop(beat)  # the process "dies" here: the lease is never released

        outside, inside, working = (_held(store, leases, f"w{i}") for i in range(3))
        seen: dict[str, list[int]] = {"outside": [], "inside": []}
        during: list[int] = []

        def model_call() -> None:
            waits.sleep(0.6)

        def look() -> None:  # while the drive waits outside, its row says so
            time.sleep(0.4)
            during.append(_waiting(store, outside.lease.run_id))

        watcher = threading.Thread(target=look)
        watcher.start()
        loop.submit(lambda: drive(outside, model_call, seen["outside"])).result(10)
        watcher.join()
        loop.submit(lambda: drive(inside, lambda: local.run(lambda: time.sleep(0.6), timeout=5),
                                  seen["inside"])).result(10)
        assert during == [1], "the row did not say the drive waited on its model call"
        assert seen == {"outside": [0], "inside": [0]}, "the mark outlived the wait, or a local skill set it"
        # deaths: the first while its drive waited on the model (marked again by hand, as a renewal would
        # leave it), the other two while their drives worked
        leases.heartbeat(outside.lease, waiting=True)
        assert _stalls_after_takeover(store, clock, leases, outside.lease.run_id) == 0
        assert _stalls_after_takeover(store, clock, leases, inside.lease.run_id) == 1
        assert _stalls_after_takeover(store, clock, leases, working.lease.run_id) == 1
        assert _waiting(store, outside.lease.run_id) == 0  # a takeover starts the new lease unmarked
    finally:
        local.close()
        loop.stop(5.0)
