"""Waits hold no thread: drives on a drive loop switch out while they wait, and each kind of call has a
lane of its own whose timeouts start when a call starts running.

The service's worker drives Runs of the support example against a real OpenAI-compatible server on
loopback that answers each call after a delay, on every backend: with two threads on each lane, the Runs'
model calls are in flight together (as many as the Runs), and every Run succeeds.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.verify import verify_chain
from harness.celery_app import ProcessDrives
from harness.config import build_runtime
from harness.domain.contracts import RunRequest
from harness.pipeline import waits
from harness.pipeline.drive_loop import DriveLoop, DriveNotStartedError
from harness.pipeline.waits import Lane
from harness.service.worker import Admission, EmbeddedWorker
from harness.settings import Settings
from harness.stores import audit_reads
from tests.fakes.slow_model import SlowModel, price_file

#: the Runs of the service worker's test: far more than its lanes' two threads each could keep waiting at once
RUNS = 60


@pytest.fixture
def loop() -> Iterator[DriveLoop]:
    drives = DriveLoop(concurrency=500)
    yield drives
    drives.stop(5.0)


def _lane_threads(before: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """The drive loop's and lanes' threads, less those in ``before`` (a lane another test of the same
    process left running is not this test's)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("lane-", "harness-drives")) and t not in before]


def _slept(seconds: float, answer: str) -> str:
    """`answer`, after `seconds` asleep (a slow call)."""
    time.sleep(seconds)
    return answer


def test_waiting_drives_hold_no_thread(loop: DriveLoop) -> None:
    """300 drives each waiting on the loop and calling a two-thread lane all wait at once: the loop's
    thread and the lane's two threads carry them."""
    others = frozenset(t for t in threading.enumerate() if t.name.startswith("lane-"))
    lane = Lane("local", 2)
    started = [0]  # drives run on the loop's one thread: a plain counter
    try:
        def drive(i: int) -> int:
            # each waits, switched out, until every drive has started (not a fixed time, which a loaded
            # machine's slow submission of 300 could outlast, letting the first finish before the last began)
            started[0] += 1
            deadline = time.monotonic() + 30
            while started[0] < 300 and time.monotonic() < deadline:
                waits.sleep(0.05)
            return lane.run(lambda: i + 1, timeout=30)

        futures = [loop.submit(functools.partial(drive, i)) for i in range(300)]
        assert [f.result(60) for f in futures] == [i + 1 for i in range(300)]
        assert loop.peak == 300
        assert len(_lane_threads(others)) <= 3  # the loop's thread and the lane's two
    finally:
        lane.close()


def test_a_drive_loop_of_several_threads_spreads_its_drives_and_keeps_its_bound() -> None:
    """Three loops, six places: drives go to the loop with the fewest, at most six are driven at once
    (the rest wait their turn), each drive stays on the thread it started on, and stop ends every loop."""
    drives = DriveLoop(concurrency=6, threads=3, name="spread")
    try:
        def drive(i: int) -> tuple[int, str]:
            thread = threading.current_thread().name
            waits.sleep(0.2)
            assert threading.current_thread().name == thread  # a greenlet never moves between threads
            return i, thread

        futures = [drives.submit(functools.partial(drive, i)) for i in range(30)]
        results = [f.result(30) for f in futures]
        assert [i for i, _ in results] == list(range(30))
        assert {name for _, name in results} == {"spread-0", "spread-1", "spread-2"}
        assert drives.peak == 6 and drives.driving == 0
    finally:
        drives.stop(5.0)
    assert not [t for t in threading.enumerate() if t.name.startswith("spread-")]
    with pytest.raises(ValueError, match="at least 1 thread"):
        DriveLoop(threads=0)


def test_a_late_loop_starts_no_new_drive_until_it_catches_up() -> None:
    """A drive that keeps its loop's thread busy (0.4 s at a stretch) makes the loop late; drives submitted
    meanwhile are held before they start, and start once the busy drive has ended."""
    drives = DriveLoop(concurrency=100, max_lag_s=0.2, name="late")
    try:
        busy_until: list[float] = []

        def busy() -> None:
            for _ in range(6):
                time.sleep(0.4)  # CPU-bound work between two waits: the loop's thread is taken
                waits.sleep(0.001)
            busy_until.append(time.monotonic())

        hog = drives.submit(busy)
        deadline = time.monotonic() + 10
        while drives.lag_s <= 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drives.lag_s > 0.2
        started = [drives.submit(time.monotonic) for _ in range(5)]
        hog.result(30)
        starts = [f.result(30) for f in started]
        assert drives.held > 0
        assert min(starts) >= busy_until[0] - 0.5  # held while the loop was late (not started in a gap)
    finally:
        drives.stop(5.0)


def test_a_stopping_loop_starts_none_of_the_drives_still_waiting_for_a_place() -> None:
    """One place, one drive in it and five waiting: stop lets the one in flight end and starts none of the
    five (their `not_started` runs instead, and their futures say so), so a stop waits for the drives in
    flight, never for the queue behind them."""
    drives = DriveLoop(concurrency=1, name="stopping")
    ran: list[int] = []
    skipped: list[int] = []
    in_flight = threading.Event()

    def drive(i: int) -> int:
        ran.append(i)
        in_flight.set()
        waits.sleep(0.3)
        return i

    first = drives.submit(lambda: drive(0), not_started=lambda: skipped.append(0))
    assert in_flight.wait(10)
    queued = [drives.submit(functools.partial(drive, i), not_started=functools.partial(skipped.append, i))
              for i in range(1, 6)]
    drives.stop(10.0)
    assert first.result(0) == 0
    assert ran == [0] and sorted(skipped) == [1, 2, 3, 4, 5]
    for future in queued:
        with pytest.raises(DriveNotStartedError):
            future.result(0)
    assert not [t for t in threading.enumerate() if t.name.startswith("stopping")]


def test_a_stopping_celery_process_starts_no_held_drive_and_frees_its_place() -> None:
    """A Celery worker process's drives: one keeps the loop busy (late), the next is handed over and held
    before it starts; the process is stopped. The held drive never runs, this process no longer counts it
    as driving (a second delivery of its Run would be taken, not refused as "already"), and every place is
    free again: its Run is left to the orphan sweep, which sends it to a live worker."""
    drives = ProcessDrives(concurrency=2, threads=1, max_lag_s=0.05)
    ran: list[str] = []

    def busy() -> None:
        for _ in range(5):
            time.sleep(0.4)  # CPU-bound work between two waits: the loop's thread is taken
            waits.sleep(0.001)
        ran.append("busy")

    assert drives.hand_over("run-busy", busy) == "driving"
    deadline = time.monotonic() + 10
    while drives.loop.lag_s <= 0.05 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert drives.loop.lag_s > 0.05
    assert drives.hand_over("run-held", lambda: ran.append("held")) == "driving"
    assert drives.hand_over("run-held", lambda: ran.append("again")) == "already"
    drives.stop(10.0)
    assert ran == ["busy"]
    assert drives.driving == 0
    for _ in range(2):  # both places were given back
        assert drives._places.acquire(timeout=0)


def test_a_stopped_loop_is_not_started_again_by_a_submit() -> None:
    """A submit that comes after the stop (a request racing a shutdown) is refused; it does not start the
    loops' threads again behind the stop's back. An explicit start() does."""
    drives = DriveLoop(concurrency=2, name="restarted")
    assert drives.submit(lambda: 1).result(10) == 1
    drives.stop(5.0)
    with pytest.raises(RuntimeError, match="stopped"):
        drives.submit(lambda: 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("restarted")]
    drives.start()
    try:
        assert drives.submit(lambda: 3).result(10) == 3
    finally:
        drives.stop(5.0)


def test_outside_a_loop_the_same_code_blocks_its_thread() -> None:
    """The primitives work from a plain thread (a CLI command, Harness.run): nothing to switch out of."""
    assert not waits.suspendable()
    waits.sleep(0.01)
    lane = Lane("local", 1)
    try:
        assert lane.run(lambda: 41 + 1, timeout=5) == 42
    finally:
        lane.close()


def test_a_timeout_starts_when_the_call_starts(loop: DriveLoop) -> None:
    """A call queued behind a slow one on a one-thread lane is timed from its own start: its wait for the
    thread does not count against it. A call that runs too long is late."""
    lane = Lane("local", 1)
    try:
        slow = loop.submit(lambda: lane.run(lambda: _slept(1.0, "slow"), timeout=5))
        time.sleep(0.1)
        quick = loop.submit(lambda: lane.run(lambda: "quick", timeout=0.5))
        assert slow.result(10) == "slow" and quick.result(10) == "quick"
        late = loop.submit(lambda: lane.run(lambda: time.sleep(0.6), timeout=0.1,
                                            late=lambda: TimeoutError("late")))
        with pytest.raises(TimeoutError, match="late"):
            late.result(10)
    finally:
        lane.close()


def test_outside_a_loop_too_a_timeout_starts_when_the_call_starts() -> None:
    """The same from plain threads (a CLI command, Harness.run): queued time is not the call's own."""
    lane = Lane("local", 1)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as callers:
            slow = callers.submit(lambda: lane.run(lambda: _slept(1.0, "slow"), timeout=5))
            time.sleep(0.1)
            quick = callers.submit(lambda: lane.run(lambda: "quick", timeout=0.5))
            assert slow.result(10) == "slow" and quick.result(10) == "quick"
        with pytest.raises(TimeoutError, match="late"):
            lane.run(lambda: time.sleep(0.6), timeout=0.1, late=lambda: TimeoutError("late"))
    finally:
        lane.close()


def test_a_queued_call_waits_no_longer_than_its_hard_limit(loop: DriveLoop) -> None:
    """The Run's own limit (`until`) bounds the wait for a thread: a call that cannot start in time is
    withdrawn and never runs."""
    lane = Lane("local", 1)
    ran: list[str] = []
    try:
        busy = loop.submit(lambda: lane.run(lambda: time.sleep(0.8), timeout=5))
        time.sleep(0.1)
        withdrawn = loop.submit(lambda: lane.run(lambda: ran.append("ran"), timeout=5,
                                                 until=time.monotonic() + 0.2,
                                                 queue_late=lambda: TimeoutError("never started")))
        with pytest.raises(TimeoutError, match="never started"):
            withdrawn.result(10)
        busy.result(10)
        time.sleep(0.1)
        assert ran == [] and lane.queued == 0
    finally:
        lane.close()


def test_a_drive_holding_a_transaction_does_not_switch_out(loop: DriveLoop) -> None:
    """While its unit of work holds a transaction, a drive blocks its thread instead of switching out:
    another drive on the same thread could otherwise wait for its locks for ever."""
    holding = [True]

    def drive() -> tuple[bool, bool]:
        with waits.holding(lambda: holding[0]):
            inside = waits.suspendable()
        return inside, waits.suspendable()

    assert loop.submit(drive).result(5) == (False, True)


def test_lanes_of_different_kinds_do_not_starve_each_other(loop: DriveLoop) -> None:
    """A burst of slow local skills fills the local lane; a model call on the model lane still runs at once."""
    local, llm = Lane("local", 2), Lane("llm", 2)
    try:
        burst = [loop.submit(lambda: local.run(lambda: time.sleep(0.5), timeout=10)) for _ in range(20)]
        time.sleep(0.05)
        began = time.monotonic()
        assert loop.submit(lambda: llm.run(lambda: "answer", timeout=10)).result(10) == "answer"
        assert local.queued > 0 and time.monotonic() - began < 0.5 * 20 / 2  # not behind the burst
        for future in burst:
            future.result(30)
    finally:
        local.close()
        llm.close()


@pytest.fixture
def slow_model() -> Iterator[SlowModel]:
    with SlowModel(delay_s=0.4) as model:
        yield model


def _slow_support(backend_url: str, slow_model: SlowModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  **more: Any) -> Settings:
    """The support example's settings on the database under test, its model the slow one (priced), memory
    off, and `more`."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("TEST_KEY", "sk-test")
    return Settings(db=backend_url, data_dir=tmp_path / "data", llm="openai", llm_model="gpt-test",
                    llm_base_url=slow_model.url, llm_api_key_env="TEST_KEY", llm_pricing=price_file(tmp_path),
                    memory="off", **more)


def test_the_service_worker_keeps_every_runs_model_call_in_flight(
        backend_url: str, slow_model: SlowModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """60 Runs of the support example, each planning, looking an order up and writing its answer with a
    slow model, through the service's worker with two threads per lane: all their model calls wait at
    once (a thread each would have capped them at two), and every Run succeeds."""
    settings = _slow_support(backend_url, slow_model, tmp_path, monkeypatch, local_skill_threads=2, llm_threads=2,
                             sandbox_threads=2)
    others = frozenset(threading.enumerate())
    slow_model.gather = RUNS  # the model answers once all 60 first calls wait at once (or after a minute)
    runtime = build_runtime(settings)
    worker = EmbeddedWorker(runtime, concurrency=1000, housekeeping_interval_s=3600)
    try:
        futures = []
        for i in range(RUNS):
            run, created = runtime.runs.submit(RunRequest(task=f"Where is order A-1001? ({i})", user_id="alice",
                                                     roles=("support_agent",)))
            assert created
            futures.append((run.run_id, worker.drive(run.run_id, Admission())))
        for _, future in futures:
            future.result(120)
        states = {run_id: runtime.runs.result(run_id).state for run_id, _ in futures}
        assert set(states.values()) == {"SUCCEEDED"}, {s: list(states.values()).count(s) for s in states.values()}
        assert slow_model.calls == 2 * RUNS
        assert slow_model.peak_in_flight == RUNS  # not two at a time: the drives waited without threads
        assert len([n for n in _lane_threads(others) if n.startswith("lane-llm")]) == 0  # the model call needs none
    finally:
        worker.stop()
        runtime.close()


def test_a_running_service_worker_lets_closes_leave_the_chain_to_it_and_chains_all_as_it_stops(
        backend_url: str, slow_model: SlowModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the service's worker runs (its housekeeping drains the outbox every pass), a closing Run does
    not wait for the chain head; once it stops, closes wait again (nobody else drains), and what was
    still in the outbox is chained on the way out."""
    runtime = build_runtime(_slow_support(backend_url, slow_model, tmp_path, monkeypatch))
    try:
        worker = EmbeddedWorker(runtime, concurrency=10, housekeeping_interval_s=3600)
        assert runtime.machine.close_waits_for_chain
        worker.start()
        assert not runtime.machine.close_waits_for_chain
        runtime.store.audit(None, "left_for_the_housekeeping", "tester", {})  # its record waits in the outbox
        assert runtime.store.outbox_backlog() == 1
        worker.stop()
        assert runtime.machine.close_waits_for_chain
        assert runtime.store.outbox_backlog() == 0
        report = verify_chain(audit_reads(runtime.store))
        assert report.ok and report.records_checked >= 1, report.problems
    finally:
        runtime.close()


def test_a_stopping_service_worker_leaves_its_backlog_queued_for_the_next_one(
        backend_url: str, slow_model: SlowModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker driving 2 Runs at a time with 20 accepted is stopped (a deploy, a SIGTERM): the 2 in flight
    end, the 18 behind them are not started on the way out but stay accepted (CREATED, no lease, nothing
    failed), and the next worker on the database drives every one of them to SUCCEEDED."""
    runtime = build_runtime(_slow_support(backend_url, slow_model, tmp_path, monkeypatch, redrive_grace_s=0))
    try:
        worker = EmbeddedWorker(runtime, concurrency=2, housekeeping_interval_s=3600)
        run_ids = []
        for i in range(20):
            run, _ = runtime.runs.submit(RunRequest(task=f"Where is order A-1001? ({i})", user_id="alice",
                                                    roles=("support_agent",)))
            worker.drive(run.run_id, Admission())
            run_ids.append(run.run_id)
        deadline = time.monotonic() + 30
        while slow_model.in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.stop(30.0)
        states = [runtime.runs.result(r).state for r in run_ids]
        assert states.count("SUCCEEDED") <= 4 and states.count("CREATED") >= 16, states
        assert set(states) <= {"SUCCEEDED", "CREATED"}, states
        queued = {r for r, state in zip(run_ids, states, strict=True) if state == "CREATED"}
        assert queued <= set(runtime.store.unowned_runs(0))  # no lease held: the next worker may take them
        assert worker.in_flight == 0
        assert slow_model.calls <= 8  # two Runs at a time, at most two model calls each
        following = EmbeddedWorker(runtime, concurrency=1000, housekeeping_interval_s=3600)
        try:
            following.start()  # picks up every Run accepted and not driven
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(runtime.runs.result(r).state != "SUCCEEDED" for r in run_ids):
                time.sleep(0.1)
            assert [runtime.runs.result(r).state for r in run_ids] == ["SUCCEEDED"] * 20
        finally:
            following.stop()
    finally:
        runtime.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_the_real_providers_answer_a_drive_with_asynchronous_io(vendor: str, stream: bool,
                                                                 loop: DriveLoop) -> None:
    """On a drive loop the OpenAI and Anthropic providers send through their SDK's asynchronous client
    (the same answer, whole or streamed, as the blocking client gives), and a retry after a 503 sleeps
    switched out; outside a loop the same provider uses its blocking client."""
    from harness.adapters.llm.anthropic import AnthropicProvider
    from harness.adapters.llm.openai_compat import OpenAICompatProvider
    from harness.adapters.llm.resilient import ProviderSettings
    from harness.domain.contracts import Message
    from harness.domain.llm import LLMRequest
    from harness.pipeline.resilience import RetryQuota
    from tests.fakes import anthropic_api, openai_api
    from tests.fakes.server import ScriptedServer

    ask = LLMRequest(purpose="answer", system="be brief", messages=(Message(role="user", content="hi"),))
    with ScriptedServer() as server:
        if vendor == "openai":
            model, base = "gpt-test", f"{server.origin}/v1"
            answer = openai_api.stream(["On its ", "way."]) if stream else openai_api.completion("On its way.")
            failure = openai_api.error(503, "down", kind="server_error")
        else:
            model, base = "claude-test", server.origin
            answer = anthropic_api.stream(["On its ", "way."]) if stream else anthropic_api.message("On its way.")
            failure = anthropic_api.error(503, "overloaded_error", "busy")
        settings = ProviderSettings(model=model, api_key="k", base_url=base, stream=stream,
                                    quota=RetryQuota(max_attempts=3, backoff_s=0.01))
        provider = (OpenAICompatProvider if vendor == "openai" else AnthropicProvider)(settings)
        try:
            server.queue(failure, answer, answer)
            on_loop = loop.submit(lambda: provider.complete(ask)).result(30)
            blocking = provider.complete(ask)
            assert on_loop.content == blocking.content == "On its way."
            assert len(server.received) == 3  # the 503, its retry, and the blocking call
            agents = [r.headers["user-agent"] for r in server.received]
            assert agents[0].startswith("Async") and agents[1].startswith("Async"), agents
            assert not agents[2].startswith("Async"), agents
        finally:
            provider.close()


def test_parallel_steps_of_a_drive_on_a_loop_run_together_in_greenlets(
        test_runtime: object, call_log: Path, loop: DriveLoop) -> None:
    """A wave of independent steps of a Run driven on a loop runs as greenlets of their own (no pool
    thread), overlapping in time; their dependent waits for both, the Run succeeds and its audit is clean."""
    import json

    from harness.config import Runtime
    from tests.acceptance.checks import assert_audit_clean

    runtime = test_runtime
    assert isinstance(runtime, Runtime)
    threads_before = {t.name for t in threading.enumerate()}
    result = loop.submit(lambda: runtime.runs.create_run(
        {"task": "parallel", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"]})).result(60)
    assert result.state == "SUCCEEDED", result.error
    assert result.answer == "a+b"
    slow = {c["step"]: c for c in map(json.loads, call_log.read_text().splitlines()) if c["skill"] == "test.slow"}
    assert slow["a"]["start"] < slow["b"]["end"] and slow["b"]["start"] < slow["a"]["end"]
    assert not [t for t in threading.enumerate() if t.name.startswith("plan-step")
                and t.name not in threads_before]  # the steps took no pool thread
    assert_audit_clean(runtime)
