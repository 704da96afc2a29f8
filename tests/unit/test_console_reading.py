"""How the console reads to a person: one count for the policy checks, step numbers without gaps, English
plurals, amounts with the currency their skill declares (and none invented), the offline model at $0 and
chart ticks at round numbers."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from harness.config import Runtime
from harness.domain.errors import ManifestError
from harness.pipeline.trace_groups import group_records
from harness.service.console_format import amount, axis_ticks, money, plural, verdict_summary
from harness.service.routes.console import TEMPLATES
from harness.skills.manifests import currency_fields, load_manifest

SUPPORT_SKILLS = Path(__file__).resolve().parents[2] / "src" / "harness" / "examples" / "support" / "skills"
MACROS: Any = TEMPLATES.env.get_template("macros.html").module  # its macros are attributes made at render


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", str(html))).strip()


def _verdict(rule: str, decision: str) -> dict[str, Any]:
    return {"rule_id": rule, "family": rule.partition(".")[0], "decision": decision, "level": None, "step_id": "s",
            "reason": "because"}


def test_the_policy_summary_counts_every_check_once() -> None:
    """2 checks asking for approval and 15 passes the trace only counts read as 17 checks, 15 of them
    passing and 2 needing approval: no number on the section is a count of something else."""
    flagged = [_verdict("guardrail.refund_lead_review", "await_hitl"), _verdict("risk.routing", "await_hitl")]
    text = _text(MACROS.verdict_section(verdict_summary(flagged, 15)))
    assert text.startswith("17 checks: 15 pass 2 need approval"), text
    assert set(re.findall(r"\b\d+\b", text)) == {"17", "15", "2"}, text
    assert "listed" not in text.replace("not listed one by one", ""), text


def test_a_summary_with_listed_passes_shows_them_under_the_same_count() -> None:
    """Older traces list their passes: those and the counted ones are one number, the one in the summary."""
    verdicts = [_verdict("a.one", "pass"), _verdict("b.two", "pass"), _verdict("c.three", "reject")]
    text = _text(MACROS.verdict_section(verdict_summary(verdicts, 1)))
    assert text.startswith("4 checks: 3 pass 1 rejects"), text
    assert "The 3 checks that pass" in text and "1 more passes" in text, text
    one = _text(MACROS.verdict_section(verdict_summary([], 1)))
    assert one.startswith("1 check: 1 passes") and "The 1 check that passes" in one, one


def _step(step: int) -> dict[str, Any]:
    return {"kind": "transition", "steps": [{"step": step, "status": "ok", "duration_ms": 0.0}]}


def test_step_numbers_do_not_skip_when_a_run_needs_no_approval() -> None:
    """A Run that passed policy at L1 has no human-approval step: its tools are step 6 and its trace step 7,
    so the numbers people see run 1 to 7."""
    records = [_step(s) for s in (1, 2, 3, 4, 5, 6, 8)]
    groups = [g for g in group_records(records, lambda r: (r["kind"], r)) if g.number is not None]
    assert [(g.number, g.label) for g in groups] == [
        (1, "Create run"), (2, "Assemble context"), (3, "Load skills"), (4, "Plan"), (5, "Policy"),
        (6, "Tools"), (7, "Trace")]


def test_a_plan_of_one_step_says_step(support_runtime: Runtime) -> None:
    """The state change after planning says "plan with 1 step", not "1 steps"."""
    result = support_runtime.runs.create_run(
        {"task": "Refund order A-1001 if it was delivered", "tenant_id": "default", "user_id": "alice"})
    reasons = [r.data().get("reason", "") for r in support_runtime.store.trace_of(result.run_id)
               if r.kind == "transition"]
    assert "plan with 1 step" in reasons, reasons


@pytest.mark.parametrize(("count", "noun", "nouns", "expected"), [
    (1, "API call", None, "1 API call"), (0, "API call", None, "0 API calls"), (3, "child run", None, "3 child runs"),
    (1, "passes", "pass", "1 passes"), (2, "needs", "need", "2 need")])
def test_counts_take_the_right_number(count: int, noun: str, nouns: str | None, expected: str) -> None:
    """One thing is singular, none or several plural."""
    assert plural(count, noun, nouns) == expected


def test_the_run_and_inbox_templates_count_in_english() -> None:
    """No template writes a plural ending on its own ("approval{{ 's' if … }}" reads "0 approval"): every
    count goes through the plural filter."""
    templates = Path(TEMPLATES.env.loader.searchpath[0])  # type: ignore[union-attr]
    for page in templates.glob("*.html"):
        assert "'s' if" not in page.read_text(), page.name


def test_the_bundled_refund_skills_declare_their_amounts_in_euro() -> None:
    """The example's orders are in EUR, and so are the amounts its refund skills take."""
    for name in ("refunds_draft.yaml", "refunds_issue.yaml"):
        skill = load_manifest(SUPPORT_SKILLS / name)
        assert currency_fields(skill.manifest.input_schema) == {"amount": "EUR"}


def test_an_amount_shows_its_currency_on_the_approval_card() -> None:
    """The approval card's action table shows 180 as 180.00 EUR for a skill that declares EUR, and as the
    bare number for a skill that declares nothing (no currency is invented)."""
    actions = [{"step_id": "issue", "skill": "refunds.issue", "arguments": {"amount": 180.0, "order_id": "A-1003"}},
               {"step_id": "tip", "skill": "tips.pay", "arguments": {"amount": 5}}]
    text = _text(MACROS.actions_table(actions, {"refunds.issue": {"amount": "EUR"}}))
    assert "amount: 180.00 EUR" in text.replace(" :", ":") or "amount 180.00 EUR" in text, text
    assert re.search(r"tips\.pay amount 5$", text), text
    assert amount(1500, "JPY") == "1,500 JPY" and amount("180", "EUR") == "180" and amount(180.0) == "180.0"


def test_a_currency_that_is_not_a_code_or_not_a_number_is_refused(tmp_path: Path) -> None:
    """`x-currency` is an ISO 4217 code on a number: a manifest with "euros" or on a string fails to load."""
    base = ("id: t.pay\nversion: 1.0.0\nentrypoint: s.py:pay\nrisk: {access: read, space: project, impact: low}\n"
            "input_schema: {type: object, properties: {amount: %s}}\n")
    (tmp_path / "s.py").write_text("def pay(args, ctx):\n    return {}\n")
    for prop, problem in (("{type: number, x-currency: euros}", "ISO 4217"),
                          ("{type: string, x-currency: EUR}", "number or integer")):
        (tmp_path / "t.yaml").write_text(base % prop)
        with pytest.raises(ManifestError, match=problem):
            load_manifest(tmp_path / "t.yaml")


def test_the_offline_scripted_model_costs_nothing(support_runtime: Runtime) -> None:
    """The example's scripted model has no price: a Run's planning is recorded at 0 USD (priced, not
    "unpriced"), and the console shows $0.00 rather than a rounded $0.0000."""
    result = support_runtime.runs.create_run({"task": "Where is order A-1001?", "tenant_id": "default",
                                              "user_id": "alice"})
    costs = [r.data() for r in support_runtime.store.trace_of(result.run_id) if r.kind == "cost"]
    assert costs and all(c["usd"] == 0 and c.get("priced", True) for c in costs), costs
    assert money(0.0) == "$0.00" and money(0.0002) == "$0.0002"


@pytest.mark.parametrize("top", [0.0, 0.0002016, 0.0008063, 0.02, 0.3, 1.0, 7.3, 123.0, 0.00048])
def test_chart_ticks_are_round_numbers(top: float) -> None:
    """The axis runs from 0 to the first round value at or above the largest bar, in at most 5 equal steps
    of 1, 2, 2.5 or 5 times a power of ten, each label with no more digits than the step needs."""
    ticks = axis_ticks(top)
    values = [v for v, _ in ticks]
    assert values[0] == 0 and values[-1] >= top and 2 <= len(ticks) <= 6
    step = values[1]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 9) in (1, 2, 2.5, 5), ticks
    for i, (value, label) in enumerate(ticks):
        assert value == pytest.approx(i * step) and float(label) == pytest.approx(value), ticks
        assert len(label.replace("0.", "").lstrip("0")) <= 3, ticks
