"""A `matches` guardrail whose value is not a regular expression is refused when the policy loads (exit 2,
naming the guardrail and the regex error), not at each call it would check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.examples.support import EXAMPLE_DIR
from harness.policy.config import Guardrail
from harness.policy.guardrails import matches

BAD = {"id": "bad_regex", "op": "matches", "value": "([", "skill": "refunds.issue", "argument": "amount",
       "verdict": "reject", "reason": "r"}


def test_a_matches_rule_with_a_bad_regex_is_refused() -> None:
    """The model refuses the rule, naming it and what is wrong with its pattern; a good pattern loads."""
    with pytest.raises(ValueError, match=r"guardrail 'bad_regex': '\(\[' is not a valid regular expression: "
                                         r"unterminated character set"):
        Guardrail.model_validate(BAD)
    good = Guardrail.model_validate({**BAD, "value": r"^4\d\."})
    assert matches(good, 42.50) and not matches(good, 142.5)


def test_run_refuses_a_policy_with_a_bad_regex(tmp_path: Path) -> None:
    """`harness run` with such a policy file ends with exit 2 before any Run, naming file, rule and error."""
    policy = yaml.safe_load((EXAMPLE_DIR / "policy.yaml").read_text(encoding="utf-8"))
    policy["permissions"]["cedar"] = str(EXAMPLE_DIR / "policies.cedar")
    policy["guardrails"].append(BAD)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    result = CliRunner().invoke(app, ["run", "Refund 42.50 EUR for order A-1001", "--db", str(tmp_path / "h.db")],
                                env={"HARNESS_POLICY_FILE": str(path),
                                     "HARNESS_EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl")})
    assert result.exit_code == 2, result.output
    assert f"{path}: guardrails." in result.output and "guardrail 'bad_regex'" in result.output, result.output
    assert "unterminated character set" in result.output and "Traceback" not in result.output
