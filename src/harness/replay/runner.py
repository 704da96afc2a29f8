"""Replay (SPEC A5): re-execute a finished Run's path from its recording and report any divergence.

The Run's request is submitted again to a fresh runtime on a temporary SQLite database (the source
database is only read). The pipeline runs for real — context assembly, plan validation, policy, HITL
rules, the Run manager's bookkeeping — but the model and the tools answer from the recording:

- `ReplayProvider` returns the recorded LLM answers (the "llm" trace records and their blobs);
- `ReplayTools` returns each step's recorded result; no skill is ever called, so nothing happens
  outside the temporary database;
- recorded human decisions are re-submitted (same approver identity, same moment on a fake clock),
  and approval timeouts fire when the recording says they did;
- what came from outside the pipeline — a cancel, a sweeper's forced close, a worker failed as poison
  input, a worker that died during a call — is re-applied where the recording says it landed
  (replay_events), so a faithful replay of any final Run reports no divergence.

Then what the replay did is compared with what the Run did: manifests, each LLM request, the plan,
every policy verdict, the HITL events, each tool call's arguments and result hashes, the state path,
and the final result. Blobs are checked against their hashes as they are read, so an edited
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
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from harness.agents import Agent
from harness.clock import FakeClock
from harness.config import Runtime, Settings, build_runtime
from harness.domain.chain import content_hash
from harness.domain.contracts import RunRequest, StepOutcome
from harness.domain.errors import BadInputError, ProviderError
from harness.domain.llm import FallbackResponse, LLMRequest, LLMResponse
from harness.domain.recorded import RecordedDecision
from harness.domain.records import RunRecord
from harness.domain.traces import ToolTrace, policy_passed, policy_verdicts, simply_passes
from harness.kernel import FINAL, RunState
from harness.knowledge.base import RecordedSearch
from harness.pipeline.tool_controller import CallResult, ToolController
from harness.replay.events import OutsideEvents, ReplayStopped, WorkerDied, move_to, outside_events
from harness.skills.manifests import Skill
from harness.stores import Store, replay_reads, set_deadline


class ReplayError(BadInputError):
    """The Run cannot be replayed: unknown, not finished, or recorded without its contents."""


@dataclass(frozen=True)
class Divergence:
    """One place where the replay did not do what the Run did."""

    #: what was compared (the path, a step's call, the answer, ...)
    check: str
    #: the step or state it concerns
    where: str
    #: what the Run did
    expected: Any
    #: what the replay did
    actual: Any
    #: more words on it
    detail: str = ""


@dataclass
class ReplayReport:
    """The outcome of one replay."""

    #: the Run replayed
    run_id: str
    #: the Run the replay made on the scratch database
    replay_run_id: str | None
    #: every place the replay did not do what the Run did (none: it is faithful)
    divergences: list[Divergence]
    #: counts of what was compared
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the replay did exactly what the Run did."""
        return not self.divergences

    def to_dict(self) -> dict[str, Any]:
        """The report as one JSON document."""
        return {"run_id": self.run_id, "replay_run_id": self.replay_run_id, "divergent": not self.ok,
                "first_divergence": asdict(self.divergences[0]) if self.divergences else None,
                "divergences": [asdict(d) for d in self.divergences], "summary": self.summary}


@dataclass(frozen=True)
class RunFacts:
    """What a Run did, as its records say: the facts a replay is compared on."""

    state: str
    path: list[str]
    manifests: dict[str, Any]
    llm: list[dict[str, Any]]
    plan_hash: str | None
    #: the verdicts that did not simply pass, and how many did: the same facts whichever trace format
    #: (every verdict listed, or the passes counted) the Run and its replay were recorded in
    policy: list[tuple[Any, ...]]
    policy_passed: int
    hitl: list[tuple[Any, ...]]
    tools: dict[str, list[dict[str, Any]]]
    result: dict[str, Any]

    @classmethod
    def of(cls, store: Store, run_id: str) -> RunFacts:
        """Read the facts of a Run from its store (chained trace plus anything still in the outbox)."""
        run = store.get_run(run_id)
        context = run.context or {}
        records = records_of(store, run_id)
        tools: dict[str, list[dict[str, Any]]] = {}
        for r in (p for k, p in records if k == "tool"):
            tools.setdefault(r["step_id"], []).append({k: r.get(k) for k in (
                "skill_id", "arguments_hash", "result_hash", "status", "error_code", "fallback_from")})
        return cls(
            state=run.state.value, path=[x.to_state.value for x in store.transitions_of(run_id)],
            manifests=context.get("manifests", {}),
            llm=[{"purpose": p["purpose"], "request_hash": p["request_hash"]}
                 for k, p in records if k == "llm"],
            plan_hash=content_hash(context["plan"]) if context.get("plan") is not None else None,
            **_policy_facts([p for k, p in records if k == "policy"]),
            hitl=[(p["event"], p["level"], p.get("approver"), p.get("break_glass", False))
                  for k, p in records if k == "hitl"],
            tools=tools, result=run.result or {},
        )


def _policy_facts(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    listed, passed = [], 0
    for p in payloads:
        passed += policy_passed(p) or 0
        for v in policy_verdicts(p):
            if simply_passes(v["rule_id"], v["decision"], v["level"]):  # a format-1 record lists its passes too
                passed += 1
            else:
                listed.append((v["rule_id"], v["family"], v["decision"], v["step_id"] or "", v["level"] or ""))
    return {"policy": sorted(listed), "policy_passed": passed}


class Recording:
    """A finished Run's recording: its trace records and the blobs they reference, read once."""

    def __init__(self, run: RunRecord, records: list[tuple[str, dict[str, Any]]], blobs: dict[str, str],
                 has_contents: bool) -> None:
        self.run = run
        self.records = records
        self.blobs = blobs
        self.has_contents = has_contents
        self.problems: list[Divergence] = []

    @classmethod
    def load(cls, source: Store, run_id: str) -> Recording:
        """Read the Run, its records and every blob they reference."""
        records = records_of(source, run_id)
        wanted = {str(p.get(k) or "") for _, p in records for k in ("response_hash", "result_hash")}
        blobs = replay_reads(source).blobs(wanted)
        if blobs is None:
            return cls(source.get_run(run_id), records, {}, has_contents=False)
        return cls(source.get_run(run_id), records, blobs, has_contents=True)

    def answers(self, purpose: str) -> list[dict[str, Any]]:
        """The recorded LLM exchanges for one purpose, in order."""
        return [p for k, p in self.records if k == "llm" and p["purpose"] == purpose]

    def tool_traces(self, step_id: str) -> list[dict[str, Any]]:
        """The tool controller's ToolTraces for one step (refusals are the Run manager's, not a call)."""
        return [p for k, p in self.records
                if k == "tool" and p["step_id"] == step_id and p["status"] != "refused"]

    def called_steps(self) -> int:
        """How many steps the tool controller was asked to run (each ToolTrace group is one call)."""
        return len({p["step_id"] for k, p in self.records if k == "tool" and p["status"] != "refused"})

    def crashed_steps(self) -> set[str]:
        """Steps whose worker died during the call: marked started, then refused as outcome unknown."""
        refused = {p["step_id"] for k, p in self.records
                   if k == "tool" and p["status"] == "refused" and p.get("error_code") == "outcome_unknown"}
        steps: dict[str, dict[str, Any]] = (self.run.context or {}).get("steps", {})
        return {s for s in refused if steps.get(s, {}).get("status") == "started"}

    def outcome(self, step_id: str) -> dict[str, Any]:
        """The StepOutcome the Run recorded in its context for a step, or {}."""
        steps: dict[str, dict[str, Any]] = (self.run.context or {}).get("steps", {})
        return steps.get(step_id, {})

    def value(self, digest: str, what: str) -> tuple[bool, Any]:
        """(found, content) of a blob; a missing or altered blob is recorded as a problem. Altered
        content is still served, so its consequences show too."""
        text = self.blobs.get(digest)
        if text is None:
            self._problem(what, digest, None, "the recording has no content for this hash")
            return False, None
        value = json.loads(text)
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != digest:
            self._problem(what, digest, content_hash(value), "the recorded content does not match its hash: "
                          "the recording was altered")
        return True, value

    def _problem(self, what: str, expected: Any, actual: Any, detail: str) -> None:
        if all(p.where != what for p in self.problems):
            self.problems.append(Divergence("recording", what, expected, actual, detail))


class ReplayProvider:
    """An LLM that answers from the recording, in order; it never reaches a network."""

    name = "replay"
    #: answers at once, from the recording: a drive calls it without a thread hop
    waits_itself = True

    def __init__(self, recording: Recording, events: OutsideEvents) -> None:
        self.recording = recording
        self.events = events
        self._served: dict[str, int] = {}

    def complete(self, request: LLMRequest) -> LLMResponse:
        """The recorded answer to the next call of this purpose (or the recorded error, as raised)."""
        answers = self.recording.answers(request.purpose)
        index = self._served.get(request.purpose, 0)
        if index >= len(answers):
            self.events.model_call_unrecorded()
            raise ProviderError(f"replay: no recorded answer for {request.purpose} call #{index + 1}",
                                kind="replay_missing", retryable=False)
        answer = answers[index]
        if answer.get("error"):  # not consumed: a retried call meets the same recorded failure
            error = answer["error"]
            raise ProviderError(error["message"], kind=error["kind"], retryable=error["retryable"])
        self._served[request.purpose] = index + 1
        found, value = self.recording.value(answer["response_hash"], f"llm answer #{index + 1}")
        if not found:
            raise ProviderError("replay: the recorded answer is missing", kind="replay_missing",
                                retryable=False)
        return (FallbackResponse if value.get("fallback_from") else LLMResponse).model_validate(value)


class ReplayedFailureError(Exception):
    """A step failure, as recorded."""


class ReplayTools:
    """The tool controller with every call answered from the recording; skills are never invoked."""

    def __init__(self, real: ToolController, recording: Recording, events: OutsideEvents) -> None:
        self._real = real
        self.recording = recording
        self.events = events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def call(self, skill: Skill, arguments: dict[str, Any], *, run_id: str, step_id: str, output_key: str,
             **_context: Any) -> CallResult:
        """The recorded outcome of this step, with the arguments the replay passed hashed afresh."""
        self.events.before_tool_call(step_id)
        recorded = self.recording.tool_traces(step_id)
        if not recorded:
            recorded = [{"skill_id": skill.id, "skill_version": skill.manifest.version, "attempts": 0,
                         "manifest_hash": skill.manifest_hash, "idempotency_key": f"{run_id}:{step_id}",
                         "duration_ms": 0.0, "status": "error", "error_code": "replay_missing"}]
        final = recorded[-1]
        output: Any = None
        served = final["status"] == "ok"
        if served:
            output = self.recording.value(final["result_hash"], f"tool result of step {step_id}")[1]
        fields = set(ToolTrace.model_fields) - {"kind"}
        traces = tuple(ToolTrace.model_validate({
            **{k: v for k, v in r.items() if k in fields}, "run_id": run_id, "step_id": step_id,
            "arguments_hash": content_hash(arguments),
            "result_hash": content_hash(output) if r is final and served else r.get("result_hash"),
        }) for r in recorded)
        recorded_outcome = self.recording.outcome(step_id)
        error = None if final["status"] == "ok" else (
            recorded_outcome.get("error") or f"{final['error_code']}: no recorded result for step {step_id}")
        # what the call printed and the files it kept are as recorded: no sandbox runs in a replay
        outcome = StepOutcome(step_id=step_id, output_key=output_key, status=final["status"], output=output,
                              error=error, attempts=final["attempts"] or 1, duration_ms=final["duration_ms"],
                              **{k: recorded_outcome[k] for k in ("stdout", "stderr", "files", "skipped_files")
                                 if k in recorded_outcome})
        failure = None if error is None else ReplayedFailureError(error.split(": ", 1)[-1])
        self.events.after_tool_call()
        return CallResult(outcome, traces[-1], failure, traces)


def records_of(store: Store, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, payload) of a Run's trace records in order: the chain, then any not yet drained."""
    chained = [(r.kind, r.data()) for r in store.trace_of(run_id)]
    return chained + replay_reads(store).outbox_records(run_id)


def compare(source: RunFacts, replay: RunFacts) -> list[Divergence]:
    """Every difference between the Run and its replay, in pipeline order."""
    found: list[Divergence] = []

    def check(name: str, where: str, expected: Any, actual: Any, detail: str = "") -> None:
        if expected != actual:
            found.append(Divergence(name, where, expected, actual, detail))

    for skill in sorted(set(source.manifests) | set(replay.manifests)):
        check("manifest", skill, source.manifests.get(skill), replay.manifests.get(skill),
              "the skill's manifest is not the one the Run used")
    for i in range(max(len(source.llm), len(replay.llm))):
        check("llm_request", f"call #{i + 1}", _at(source.llm, i), _at(replay.llm, i),
              "the model was asked something else than in the recording")
    check("plan", "plan hash", source.plan_hash, replay.plan_hash)
    check("policy", "verdicts", source.policy, replay.policy)
    check("policy", "passes", source.policy_passed, replay.policy_passed,
          "a different number of rule verdicts passed")
    check("hitl", "events", source.hitl, replay.hitl)
    for step in sorted(set(source.tools) | set(replay.tools)):
        check("tool_call", f"step {step}", source.tools.get(step), replay.tools.get(step),
              "arguments, status or result of the call differ")
    check("path", "state path", source.path, replay.path)
    check("result", "final state", source.state, replay.state)
    check("result", "run result", content_hash(source.result), content_hash(replay.result),
          json.dumps({"recorded": source.result, "replayed": replay.result}, default=str)[:2000])
    return found


def _at(items: list[Any], index: int) -> Any:
    return items[index] if index < len(items) else None


def replay(run_id: str, source: Store, settings: Settings | None = None, agent: Agent | None = None) -> ReplayReport:
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


def _replay_humans(rt: Runtime, clock: FakeClock, source: Store, run_id: str, replay_id: str,
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
