"""Gatekeeper (step ⑤ and ⑦, seed 004 §3.4): the policy engine's unified decision on a plan.

Four rule families (SPEC G1) each give verdicts: structural (every call names a known skill and its
literal arguments fit the schema), permission (Cedar), budget (recorded cost plus the plan's
estimate against per-Run, per-user and per-tenant caps) and guardrail (argument rules); then risk
routing (G2) gives each call its approval level. Any reject rejects; otherwise the highest level
decides: L1 passes, L2-L4 wait for a human (G3). An evaluation becomes one PolicyTrace carrying the
decision, the rule set's hash and every verdict that did not simply pass (the passes are counted).

At execution time `check_call` re-applies the guardrails to the now-concrete arguments, so a value
that was a `$ref` at planning is still checked before the side effect happens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from harness.domain.chain import content_hash
from harness.domain.contracts import CallerIdentity, PolicyDecision, Verdict
from harness.domain.costs import Spend
from harness.domain.plans import Plan, PlanStep, refs_in
from harness.domain.traces import PolicyTrace, policy_trace
from harness.pipeline.call_budget import Room
from harness.policy.cedar import CedarPermissions
from harness.policy.config import Level, PolicyFile, load_policy_file
from harness.policy.guardrails import UNKNOWN, argument_value, matches
from harness.policy.risk import highest, level_for
from harness.ports.ledger import SpendReads
from harness.skills.manifests import Skill, SkillRegistry

#: entries an engine's caches hold before they are emptied (they refill from the same inputs)
_CACHE_LIMIT = 10_000


@dataclass(frozen=True)
class Evaluation:
    """A decision (with every verdict) and the trace that explains it: one compact PolicyTrace."""

    decision: PolicyDecision
    traces: tuple[PolicyTrace, ...]


class PolicyEngine:
    """Evaluates plans and calls against a policy file and its Cedar permissions."""

    def __init__(self, policy: PolicyFile, permissions: CedarPermissions, registry: SkillRegistry,
                 ledger: SpendReads | None = None) -> None:
        self.policy = policy
        self.permissions = permissions
        self.registry = registry
        self.ledger = ledger
        self._visible: dict[tuple[object, ...], bool] = {}
        #: the rule set's hash each PolicyTrace names: the policy file and its Cedar policies
        self.rules_hash = content_hash({"policy": policy.model_dump(mode="json"), "cedar": permissions.text_hash})
        self._validators: dict[tuple[str, str], jsonschema.Draft202012Validator] = {}

    @classmethod
    def from_file(cls, path: Path, registry: SkillRegistry, ledger: SpendReads | None = None) -> PolicyEngine:
        """Load a policy file and the Cedar file it names."""
        policy = load_policy_file(path)
        cedar = CedarPermissions.from_file((path.parent / policy.permissions.cedar).resolve())
        return cls(policy, cedar, registry, ledger)

    def may_call(self, caller: CallerIdentity, skill: Skill) -> bool:
        """Whether the caller may see and call this skill at all (used to filter the skill list, T2).

        Cached per identity and manifest: the answer depends on nothing else, and the policy set of an
        engine never changes (a new policy means a new engine)."""
        key = (caller.tenant_id, caller.user_id, caller.roles, skill.id, skill.manifest_hash)
        cached = self._visible.get(key)
        if cached is None:
            cached, _ = self.permissions.is_permitted(caller, skill, {})
            if len(self._visible) > _CACHE_LIMIT:
                self._visible.clear()
            self._visible[key] = cached
        return cached

    def evaluate(self, plan: Plan, caller: CallerIdentity, run_id: str, *,
                 chain_remaining: int | None = None, round_no: int = 1, max_rounds: int | None = None) -> Evaluation:
        """The unified decision on a plan, with every rule's verdict. `chain_remaining` is the Run's
        delegation budget (seed 004 §4.1): with none left, a step that would start a child Run is
        rejected here, before any side effect; None skips the rule. A plan asking for another round
        when the Run is in its `max_rounds`-th round is rejected before any of its calls start."""
        started = time.perf_counter()
        verdicts: list[Verdict] = self._shape(plan, round_no, max_rounds)
        levels: list[Level] = []
        checked = [(step, self.registry.get(step.tool_call.skill)) for step in plan.steps]
        structurals = [self._structural(step, skill) for step, skill in checked]
        callable_steps = [(step, skill) for (step, skill), v in zip(checked, structurals, strict=True)
                          if skill is not None and v.decision != "reject"]
        permissions = iter(self._permissions(callable_steps, caller))  # one Cedar evaluation for the plan
        for (step, skill), structural in zip(checked, structurals, strict=True):
            verdicts.append(structural)
            if skill is None or structural.decision == "reject":
                continue
            verdicts.append(next(permissions))
            if skill.manifest.call_kind == "agent" and chain_remaining is not None:
                verdicts.append(self._delegation(step, skill, chain_remaining))
            guard_verdicts = self._guardrails(step, step.tool_call.arguments)
            verdicts.extend(guard_verdicts)
            level = level_for(skill.manifest.risk)
            levels.append(level)
            levels.extend(v.level for v in guard_verdicts if v.level is not None)
            verdicts.append(Verdict(rule_id="risk.routing", family="risk", step_id=step.id, level=level,
                                    decision="pass" if level == "L1" else "await_hitl",
                                    reason=f"{skill.manifest.risk.access} in {skill.manifest.risk.space} space, "
                                           f"{skill.manifest.risk.impact} impact -> {level}"))
        verdicts.extend(self._budgets(plan, caller, run_id))
        top = highest(levels)
        if any(v.decision == "reject" for v in verdicts):
            decision = "reject"
        elif top != "L1":
            decision = "await_hitl"
        else:
            decision = "pass"
        trace = policy_trace(run_id, decision, top, verdicts, self.rules_hash,
                             duration_us=round((time.perf_counter() - started) * 1e6, 1))
        return Evaluation(PolicyDecision(decision=decision, verdicts=tuple(verdicts), level=top), (trace,))

    @staticmethod
    def _shape(plan: Plan, round_no: int, max_rounds: int | None) -> list[Verdict]:
        """Verdicts on the plan as a whole: a direct answer, and the rounds budget (SPEC K2, rounds)."""
        out = []
        if not plan.steps:
            out.append(Verdict(rule_id="structural.direct_answer", family="structural", decision="pass",
                               reason="a plan with no steps is a direct answer: nothing to execute"))
        if plan.then == "next_round" and max_rounds is not None:
            over = round_no >= max_rounds
            out.append(Verdict(rule_id="budget.rounds", family="budget", decision="reject" if over else "pass",
                               reason=f"round {round_no} asks for another round; this Run may plan at most "
                                      f"{max_rounds} round(s)" + (" (HARNESS_MAX_ROUNDS)" if over else "")))
        return out

    def check_call(self, step: PlanStep, arguments: dict[str, Any]) -> Verdict | None:
        """Re-apply the guardrails to concrete arguments at execution time; the rejecting verdict, if any."""
        for verdict in self._guardrails(step, arguments):
            if verdict.decision == "reject":
                return verdict
        return None

    def _structural(self, step: PlanStep, skill: Skill | None) -> Verdict:
        if skill is None:
            return Verdict(rule_id="structural.known_skill", family="structural", decision="reject", step_id=step.id,
                           reason=f"step {step.id} calls unknown skill {step.tool_call.skill!r}")
        literal = {k: v for k, v in step.tool_call.arguments.items() if not refs_in(v)}
        try:
            self._validator(skill).validate(literal)
        except jsonschema.ValidationError as exc:
            return Verdict(rule_id="structural.arguments", family="structural", decision="reject", step_id=step.id,
                           reason=f"step {step.id}: arguments do not fit {skill.id}'s schema: {exc.message}")
        return Verdict(rule_id="structural.arguments", family="structural", decision="pass", step_id=step.id,
                       reason=f"step {step.id}: {skill.id} {skill.manifest.version} arguments fit the schema")

    def _validator(self, skill: Skill) -> jsonschema.Draft202012Validator:
        """The compiled check of a skill's literal arguments, cached per manifest (its hash fixes the schema)."""
        key = (skill.id, skill.manifest_hash)
        validator = self._validators.get(key)
        if validator is None:
            schema = dict(skill.manifest.input_schema)
            schema.pop("required", None)  # referenced arguments are checked once they are known
            validator = jsonschema.Draft202012Validator(schema)
            if len(self._validators) > _CACHE_LIMIT:
                self._validators.clear()
            self._validators[key] = validator
        return validator

    def _permissions(self, steps: list[tuple[PlanStep, Skill]], caller: CallerIdentity) -> list[Verdict]:
        literal = [{k: v for k, v in step.tool_call.arguments.items() if not refs_in(v)} for step, _ in steps]
        answers = self.permissions.are_permitted(caller, [(skill, args) for (_, skill), args in
                                                          zip(steps, literal, strict=True)])
        who = f"{caller.tenant_id}/{caller.user_id} (roles: {', '.join(caller.roles) or 'none'})"
        return [Verdict(rule_id="permission.cedar", family="permission", step_id=step.id,
                        decision="pass" if allowed else "reject",
                        reason=f"{who} {'may' if allowed else 'may not'} call {skill.id} [{why}]")
                for (step, skill), (allowed, why) in zip(steps, answers, strict=True)]

    @staticmethod
    def _delegation(step: PlanStep, skill: Skill, chain_remaining: int) -> Verdict:
        """A step that starts a child Run spends one level of the Run's delegation budget."""
        if chain_remaining <= 0:
            return Verdict(rule_id="budget.delegation", family="budget", decision="reject", step_id=step.id,
                           reason=f"step {step.id}: {skill.id} would start a child Run, but this Run may not "
                                  "delegate further (chain_remaining is 0)")
        return Verdict(rule_id="budget.delegation", family="budget", decision="pass", step_id=step.id,
                       reason=f"step {step.id}: {skill.id} starts a child Run, which may delegate "
                              f"{chain_remaining - 1} level(s) further")

    def _guardrails(self, step: PlanStep, arguments: dict[str, Any]) -> list[Verdict]:
        out = []
        for rule in self.policy.guardrails:
            if rule.skill != step.tool_call.skill:
                continue
            value = argument_value(arguments, rule.argument)
            rule_id = f"guardrail.{rule.id}"
            if value is UNKNOWN:
                out.append(Verdict(rule_id=rule_id, family="guardrail", decision="await_hitl", step_id=step.id,
                                   level=rule.level or "L3",
                                   reason=f"{rule.argument} is only known at execution; a human must approve "
                                          "and the rule is re-checked before the call"))
            elif matches(rule, value):
                decision = "reject" if rule.verdict == "reject" else "await_hitl"
                out.append(Verdict(rule_id=rule_id, family="guardrail", decision=decision, step_id=step.id,
                                   level=rule.level, reason=rule.reason or f"{rule.argument} {rule.op} {rule.value}"))
            else:
                out.append(Verdict(rule_id=rule_id, family="guardrail", decision="pass", step_id=step.id,
                                   reason=f"{rule.argument}={value!r} is within the rule"))
        return out

    def _budgets(self, plan: Plan, caller: CallerIdentity, run_id: str) -> list[Verdict]:
        caps = self.policy.budgets
        estimate = plan.budget_estimate.cost_usd
        if self.ledger is None:
            spend = Spend(0.0, 0.0, 0.0)
        elif caps.per_run_usd is None and caps.per_user_usd is None and caps.per_tenant_usd is None:
            return self._unpriced(tuple(self.ledger.unpriced_calls(run_id)))
        else:  # the spend and the unpriced calls in one read
            spend = self.ledger.spend(tenant_id=caller.tenant_id, user_id=caller.user_id, run_id=run_id)
        scopes = [("run", caps.per_run_usd, spend.run_usd), ("user", caps.per_user_usd, spend.user_usd),
                  ("tenant", caps.per_tenant_usd, spend.tenant_usd)]
        out = []
        for scope, cap, spent in scopes:
            if cap is None:
                continue
            over = spent + estimate > cap
            out.append(Verdict(rule_id=f"budget.per_{scope}", family="budget", decision="reject" if over else "pass",
                               reason=f"{scope} spent {spent:.4f} + plan estimate {estimate:.4f} "
                                      f"{'exceeds' if over else 'within'} cap {cap:.2f} USD"))
        return [*self._unpriced(spend.unpriced_models), *out]

    def budget_room(self, caller: CallerIdentity, run_id: str) -> Room | None:
        """What the tightest of the caller's budget caps has left for the Run (None without caps or a
        ledger): what a model call's worst case must fit before the call is made."""
        caps = self.policy.budgets
        if self.ledger is None or (caps.per_run_usd is None and caps.per_user_usd is None
                                   and caps.per_tenant_usd is None):
            return None
        spend = self.ledger.spend(tenant_id=caller.tenant_id, user_id=caller.user_id, run_id=run_id)
        rooms = [Room(scope, cap, spent) for scope, cap, spent in (
            ("run", caps.per_run_usd, spend.run_usd), ("user", caps.per_user_usd, spend.user_usd),
            ("tenant", caps.per_tenant_usd, spend.tenant_usd)) if cap is not None]
        return min(rooms, key=lambda r: r.left_usd)

    def _unpriced(self, models: tuple[str, ...]) -> list[Verdict]:
        """A verdict on the Run's calls of models without a price: budgets cannot count them, so the policy
        says whether that is allowed (with a warning) or refused."""
        if not models:
            return []
        deny = self.policy.budgets.unpriced_model == "deny"
        return [Verdict(rule_id="budget.unpriced_model", family="budget", decision="reject" if deny else "pass",
                        reason=f"no price for {', '.join(models)}: its calls count 0 USD against the budgets; "
                               + ("refused by policy" if deny else "allowed with a warning by policy"))]
