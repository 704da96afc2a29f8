"""A finished Run's recording, and the model and the tool controller that answer from it: a replay calls no
model and no skill, so nothing happens outside its scratch database."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from harness.domain.chain import content_hash
from harness.domain.contracts import StepOutcome
from harness.domain.errors import ProviderError
from harness.domain.llm import FallbackResponse, LLMRequest, LLMResponse
from harness.domain.traces import ToolTrace
from harness.pipeline.tool_controller import CallResult, ToolController
from harness.replay.facts import Divergence, records_of
from harness.stores import replay_reads

if TYPE_CHECKING:
    from harness.domain.records import RunRecord
    from harness.replay.events import OutsideEvents
    from harness.skills.manifests import Skill
    from harness.stores import SqlStore


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
    def load(cls, source: SqlStore, run_id: str) -> Recording:
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
