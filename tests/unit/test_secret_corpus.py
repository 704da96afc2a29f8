"""The secret filter against its canary corpus (SPEC C4, tests/fixtures/secret_canaries.yaml): recall
100% over at least 60 secrets (prose in several languages, key formats, obfuscation), false positives at
most 5% over at least 30 innocent look-alikes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.context.prose_secrets import normalise
from harness.context.secrets import SecretFilter

CORPUS: dict[str, list[dict[str, str]]] = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "fixtures" / "secret_canaries.yaml").read_text(encoding="utf-8"))
SECRETS, INNOCENTS = CORPUS["secrets"], CORPUS["innocents"]
MAX_FALSE_POSITIVE_RATE = 0.05


@pytest.fixture(scope="module")
def secret_filter() -> SecretFilter:
    """One filter for the module."""
    return SecretFilter()


def leaked(scrub: SecretFilter, case: dict[str, str]) -> str | None:
    """Why the case's secret survived the filter (None when it did not): it is still in the output, read
    the way the filter reads (normalised), or nothing was redacted."""
    out = scrub.scrub(case["text"]).text
    if normalise(case["secret"])[0] in normalise(out)[0]:
        return f"{case['name']}: secret still in {out!r}"
    if "[REDACTED:" not in out:
        return f"{case['name']}: nothing redacted in {out!r}"
    return None


def test_the_corpus_is_large_enough_and_well_formed() -> None:
    """At least 60 secrets and 30 innocents, unique names, every secret part of its text."""
    assert len(SECRETS) >= 60 and len(INNOCENTS) >= 30
    names = [c["name"] for c in SECRETS + INNOCENTS]
    assert len(names) == len(set(names))
    for case in SECRETS:
        assert normalise(case["secret"])[0] in normalise(case["text"])[0], case["name"]


def test_recall_is_100_percent_and_false_positives_at_most_5_percent(secret_filter: SecretFilter,
                                                                     record_property: Any) -> None:
    """Every canary is removed; at most 5% of the look-alikes are changed. The numbers are reported."""
    misses = [m for m in (leaked(secret_filter, c) for c in SECRETS) if m]
    false_positives = [f"{c['name']}: {secret_filter.scrub(c['text']).text!r}" for c in INNOCENTS
                       if secret_filter.scrub(c["text"]).text != c["text"]]
    recall = 1 - len(misses) / len(SECRETS)
    fp_rate = len(false_positives) / len(INNOCENTS)
    record_property("recall", recall)
    record_property("false_positive_rate", fp_rate)
    print(f"secret corpus: recall {recall:.1%} over {len(SECRETS)} secrets, false positives {fp_rate:.1%} "
          f"over {len(INNOCENTS)} innocents")
    assert misses == [], "\n".join(misses)
    assert fp_rate <= MAX_FALSE_POSITIVE_RATE, "\n".join(false_positives)


@pytest.mark.parametrize("case", SECRETS, ids=[c["name"] for c in SECRETS])
def test_each_secret_is_removed(secret_filter: SecretFilter, case: dict[str, str]) -> None:
    """Each canary on its own (so a regression names the case)."""
    assert leaked(secret_filter, case) is None


@pytest.mark.parametrize("case", INNOCENTS, ids=[c["name"] for c in INNOCENTS])
def test_each_innocent_look_alike_passes(secret_filter: SecretFilter, case: dict[str, str]) -> None:
    """Each look-alike on its own; a few may fail within the 5% budget, but none does today."""
    assert secret_filter.scrub(case["text"]).text == case["text"]
