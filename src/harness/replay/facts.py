"""What a Run did, as its records say (its facts), and every place where a replay's facts differ from the
Run's, in pipeline order: the divergences a replay reports."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from harness.domain.chain import content_hash
from harness.domain.traces import policy_passed, policy_verdicts, simply_passes
from harness.stores import replay_reads

if TYPE_CHECKING:
    from harness.stores import SqlStore


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
    def of(cls, store: SqlStore, run_id: str) -> RunFacts:
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


def records_of(store: SqlStore, run_id: str) -> list[tuple[str, dict[str, Any]]]:
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
