"""Replay (SPEC A5): re-execute a finished Run's path from its recording and report any divergence.

The Run's request is submitted again to a fresh runtime on a temporary SQLite database (the source
database is only read). The pipeline runs for real — context assembly, plan validation, policy, HITL
rules, the Run manager's bookkeeping — but the model and the tools answer from the recording
(harness.replay.recording):

- `ReplayProvider` returns the recorded LLM answers (the "llm" trace records and their blobs);
- `ReplayTools` returns each step's recorded result; no skill is ever called, so nothing happens
  outside the temporary database;
- recorded human decisions are re-submitted (same approver identity, same moment on a fake clock),
  and approval timeouts fire when the recording says they did;
- what came from outside the pipeline — a cancel, a sweeper's forced close, a worker failed as poison
  input, a worker that died during a call — is re-applied where the recording says it landed
  (replay_events), so a faithful replay of any final Run reports no divergence.

Then what the replay did is compared with what the Run did (harness.replay.facts): manifests, each LLM
request, the plan, every policy verdict, the HITL events, each tool call's arguments and result hashes, the
state path, and the final result. Blobs are checked against their hashes as they are read, so an edited
recording is named as such. The first divergence is the earliest in pipeline order.

Limits: budget and memory state are seeded from the source (costs and memory of the tenant before
the Run began), and so are the tenant's knowledge-base documents: the snippets given are the chunks the
Run's trace names, in its order (a chunk removed since shows as a divergence of the model's request);
other shared state (e.g. other Runs' pending approvals) is not reconstructed; a failure that came from
real time passing between steps (the execution limit checked before a step)
is not reproduced by a replay whose calls are instant.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from harness.agents import Agent
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import RunRequest
from harness.domain.errors import BadInputError
from harness.domain.recorded import RecordedDecision
from harness.kernel.states import FINAL, RunState
from harness.knowledge.base import RecordedSearch
from harness.pipeline.tool_controller import ToolController
from harness.replay.events import OutsideEvents, ReplayStopped, WorkerDied, move_to, outside_events
from harness.replay.facts import ReplayReport, RunFacts, compare, records_of
from harness.replay.recording import Recording, ReplayProvider, ReplayTools
from harness.settings import Settings
from harness.stores import SqlStore, replay_reads, set_deadline


class ReplayError(BadInputError):
    """The Run cannot be replayed: unknown, not finished, or recorded without its contents."""


def replay(run_id: str, source: SqlStore, settings: Settings | None = None, agent: Agent | None = None) -> ReplayReport:
    """Replay one finished Run of `source` (read only) and compare; ReplayError when it cannot be. `agent`:
    the agent the Run ran for, when it is defined in code (an agent file is found from the settings)."""
    run = source.get_run(run_id)
    if run.state not in FINAL:
        raise ReplayError(f"run {run_id} is {run.state.value}; only a finished Run can be replayed")
    recording = Recording.load(source, run_id)
    if not recording.has_contents and any(k in ("llm", "tool") for k, _ in records_of(source, run_id)):
        raise ReplayError(f"run {run_id} was recorded without its contents (before blob recording)")
    base = settings or Settings.from_env()
    # the budget the Run was given is an input: a lower setting today must not refuse the replay
    chain = run.request.get("chain_remaining")
    base = base.model_copy(update={"chain_depth": max(base.chain_depth, chain if isinstance(chain, int) else 0)})
    events = OutsideEvents(outside_events(source, run_id), plan_answers=len(recording.answers("plan")),
                           tool_steps=recording.called_steps(), crashed_steps=recording.crashed_steps())
    with _scratch_runtime(base, run.created_at, recording, events, agent) as (rt, clock):
        replay_reads(source).seed(rt.store, run.tenant_id, run.created_at)
        given = [c["chunk_id"] for kind, record in records_of(source, run_id) if kind == "context"
                 for c in record.get("knowledge", [])]
        if given and rt.knowledge is not None:  # the chunks the Run was given, not a search of today's ranking
            rt.runs.assembler.knowledge = RecordedSearch(rt.knowledge, given)
        follow = _follow_clock(clock, [x.at for x in source.transitions_of(run_id)])
        rt.machine.subscribe(lambda _rid, _s, _t: follow(), at_commit=False)
        request = RunRequest.model_validate({**run.request, "retry_of": None})
        new, _ = rt.runs.submit(request)
        if run.deadline_at is not None:  # a child Run: due when its parent gave it, its approvals too
            set_deadline(rt.store, new.run_id, run.deadline_at)
        events.begin(rt, clock, new.run_id)
        _settle(rt, new.run_id, lambda: rt.runs.drive(new.run_id))
        _replay_humans(rt, clock, source, run_id, new.run_id, events)
        rt.store.drain_all()
        expected, actual = RunFacts.of(source, run_id), RunFacts.of(rt.store, new.run_id)
        divergences = recording.problems + compare(expected, actual)
        summary = {"path": actual.path, "state": actual.state, "llm_calls": len(actual.llm),
                   "tool_calls": sum(len(v) for v in actual.tools.values()),
                   "policy_verdicts": len(actual.policy) + actual.policy_passed}
        return ReplayReport(run_id, new.run_id, divergences, summary)


def _settle(rt: Runtime, replay_id: str, step: Callable[[], object]) -> None:
    """Run one step of the replay (a drive, a decision): a drive stopped by an outside close ends it, and
    a drive whose recorded worker died mid-call is followed by a new drive, as a new worker took over."""
    for _ in range(64):  # bounded: each recorded crash happens once
        try:
            step()
            return
        except ReplayStopped:
            return
        except WorkerDied:
            step = functools.partial(rt.runs.drive, replay_id)  # the new worker's drive


@contextmanager
def _scratch_runtime(base: Settings, start: float, recording: Recording, events: OutsideEvents,
                     agent: Agent | None = None) -> Iterator[tuple[Runtime, FakeClock]]:
    """A runtime on a temporary database and folder, answering from the recording."""
    with tempfile.TemporaryDirectory(prefix="harness-replay-") as tmp:
        clock = FakeClock(start)
        scratch = Path(tmp)
        settings = base.model_copy(update={"db": str(scratch / "replay.db"), "data_dir": scratch / "data"})
        rt = build_runtime(settings, clock=clock, provider=ReplayProvider(recording, events), agent=agent)
        rt.runs.tools = cast(ToolController, ReplayTools(rt.runs.tools, recording, events))
        # the replay is the scratch database's only driver, on a clock that jumps to recorded moments: a
        # lease would seem to lapse at every jump and fence the drive, so it drives without one
        rt.runs.driver = None
        try:
            yield rt, clock
        finally:
            rt.close()


def _follow_clock(clock: FakeClock, times: list[float]) -> Callable[[], None]:
    """After the n-th replayed transition, move the fake clock to when the Run made its n-th."""
    pending = iter(times[1:])

    def follow() -> None:
        at = next(pending, None)
        if at is not None and at > clock.now():
            clock.advance(at - clock.now())
    return follow


def _replay_humans(rt: Runtime, clock: FakeClock, source: SqlStore, run_id: str, replay_id: str,
                   events: OutsideEvents) -> None:
    """Re-submit the Run's human decisions, apply its approval timeouts (and escalations) and any outside
    event that came while it waited (a cancel), each at its recorded moment, in that order."""
    recorded = replay_reads(source)
    decisions, timeouts = recorded.decisions(run_id), recorded.approval_timeouts(run_id)
    moments: list[tuple[float, int, Callable[[], object]]] = [
        (float(at), 0, rt.runs.expire_approvals) for at in timeouts]
    moments += [(event.at, 1, functools.partial(events.apply_waiting, event)) for event in events.while_waiting()]
    moments += [(float(d.at), 2, functools.partial(_decide_as_recorded, rt, replay_id, d)) for d in decisions]
    for at, _, action in sorted(moments, key=lambda m: (m[0], m[1])):
        move_to(clock, at)
        _settle(rt, replay_id, action)
    if rt.store.get_run(replay_id).state == RunState.AWAITING_HITL:
        leaving = [x.at for x in source.transitions_of(run_id) if x.from_state == RunState.AWAITING_HITL]
        if leaving:
            move_to(clock, leaving[-1])
            _settle(rt, replay_id, rt.runs.expire_approvals)


def _decide_as_recorded(rt: Runtime, replay_id: str, decision: RecordedDecision) -> None:
    """Submit one recorded decision on the replayed Run's pending request, as the same identity."""
    rt.runs.expire_approvals()
    pending = [r for r in rt.hitl.for_run(replay_id) if r.status == "pending"]
    tenant, _, user = decision.approver.partition("/")
    approver = rt.identities.find(tenant, user)
    if pending and approver is not None:  # otherwise the divergence shows in the HITL events and the path
        rt.runs.decide(pending[-1].request_id, approver, decision.decision, break_glass=decision.break_glass,
                       reason=decision.reason)
