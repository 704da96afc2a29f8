"""How the console shows values: badges for states, human durations and times, compact arguments."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from typing import Any

from harness.domain.traces import policy_verdicts
from harness.kernel.projection import job_status
from harness.kernel.states import FINAL, RunState
from harness.timefmt import parse_deadline_reason

S = RunState
_TONE = {
    S.SUCCEEDED: "ok",
    S.CLOSED_FAILED: "bad",
    S.FAILED: "bad",
    S.TIMEOUT: "bad",
    S.CLOSED_REJECTED: "rejected",
    S.REJECTED: "rejected",
    S.CLOSED_CANCELLED: "muted",
    S.CANCELLED: "muted",
    S.AWAITING_HITL: "wait",
}
_LABEL = {
    S.AWAITING_HITL: "awaiting approval",
    S.CLOSED_REJECTED: "closed · rejected",
    S.CLOSED_FAILED: "closed · failed",
    S.CLOSED_CANCELLED: "closed · cancelled",
}
LEVEL_LABEL = {"L1": "automatic", "L2": "self-confirm", "L3": "named approver", "L4": "dual review"}


def tone(state: str) -> str:
    """The badge colour family of a state: ok, bad, rejected, muted, wait, or busy (in progress)."""
    try:
        return _TONE.get(RunState(state), "busy")
    except ValueError:
        return "muted"


def state_label(state: str) -> str:
    """A state as people read it."""
    try:
        return _LABEL.get(RunState(state), state.replace("_", " ").lower())
    except ValueError:
        return state


def legacy_of(state: str) -> str:
    """The legacy status a state projects to."""
    return job_status(RunState(state)).value


def duration(seconds: float | None) -> str:
    """12 ms, 3.4 s, 5 min 2 s, 2 h 5 min."""
    if seconds is None:
        return "ongoing"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _epoch(value: dt.datetime | float) -> float:
    return value.timestamp() if isinstance(value, dt.datetime) else float(value)


def iso(value: dt.datetime | float) -> str:
    """An ISO-8601 UTC timestamp (for the title attribute and the script)."""
    return dt.datetime.fromtimestamp(_epoch(value), dt.UTC).isoformat(timespec="seconds")


def clock(value: dt.datetime | float) -> str:
    """Short UTC time of day with date."""
    return dt.datetime.fromtimestamp(_epoch(value), dt.UTC).strftime("%d %b %H:%M:%S UTC")


def short(run_id: str) -> str:
    """The end of an id, enough to tell Runs apart at a glance: ids are time-ordered, so their first
    characters are the creation time, shared by every Run of the same minute; the last ones are random."""
    tail = run_id.replace("-", "")[-8:]
    return f"…{tail}" if len(run_id) > 8 else run_id


def compact(value: Any, limit: int = 80) -> str:
    """A value in one short line: strings as they are, structures as compact JSON, cut at `limit`."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: ISO 4217 currencies whose amounts have no minor unit
_NO_CENTS = frozenset({"CLP", "ISK", "JPY", "KRW", "UGX", "VND", "XAF", "XOF"})


def amount(value: Any, currency: str | None = None) -> str:
    """An argument as the console shows it; an amount of money with its currency ("180.00 EUR") when its
    skill declares one, the bare value otherwise (no currency is guessed)."""
    if currency is None or isinstance(value, bool) or not isinstance(value, int | float):
        return compact(value, 60)
    return f"{value:,.{0 if currency in _NO_CENTS else 2}f} {currency}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count with its noun in the right number: "1 API call", "0 API calls", "2 child runs"."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def axis_ticks(top: float, most: int = 5) -> list[tuple[float, str]]:
    """Round values for a chart's axis, from 0 to the first at or above `top`: steps of 1, 2, 2.5 or 5 times a
    power of ten, at most `most` steps, each labelled with just the decimals the step needs ("0.0005")."""
    top = top if top > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(top / most))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power * most >= top * (1 - 1e-9))
    decimals = next(d for d in range(16) if abs(round(step, d) - step) <= step * 1e-9)
    steps = math.ceil(top / step - 1e-9)
    return [(round(i * step, decimals), f"{i * step:.{decimals}f}" if i else "0") for i in range(steps + 1)]


@dataclass(frozen=True)
class VerdictSummary:
    """A Run's policy checks counted once: every count is part of `total`. The trace lists the verdicts
    that did not simply pass (and, in older records, the passes too); the rest it only counts."""

    total: int
    passing: int
    waiting: int
    rejecting: int
    #: the verdicts that did not pass, for the table shown at once
    flagged: list[dict[str, Any]]
    #: passes the trace lists one by one, and passes it only counts
    listed_passes: list[dict[str, Any]]
    counted_passes: int


def verdict_summary(verdicts: list[dict[str, Any]], passed: int) -> VerdictSummary:
    """The listed verdicts and the count of passes the trace did not list, as one summary."""
    flagged = [v for v in verdicts if v["decision"] != "pass"]
    listed = [v for v in verdicts if v["decision"] == "pass"]
    return VerdictSummary(
        total=len(verdicts) + passed, passing=len(listed) + passed,
        waiting=sum(v["decision"] == "await_hitl" for v in flagged),
        rejecting=sum(v["decision"] == "reject" for v in flagged),
        flagged=flagged, listed_passes=listed, counted_passes=passed)


def size(count: int) -> str:
    """A number of bytes for people: 812 B, 4.2 KiB, 3.1 MiB."""
    if count < 1024:
        return f"{count} B"
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 1024 / 1024:.1f} MiB"


def money(usd: float) -> str:
    """US dollars with enough precision for LLM costs; nothing spent is "$0.00", not a rounded "$0.0000"."""
    return f"${usd:,.4f}" if 0 < usd < 1 else f"${usd:,.2f}"


FILTERS = {
    "tone": tone,
    "state_label": state_label,
    "legacy_of": legacy_of,
    "duration": duration,
    "iso": iso,
    "clock": clock,
    "short": short,
    "deadline_of": parse_deadline_reason,
    "compact": compact,
    "money": money,
    "size": size,
    "amount": amount,
    "plural": plural,
    "verdict_summary": verdict_summary,
    "policy_verdicts": policy_verdicts,
}
STEP_LABEL = {
    "create_run": "Create run",
    "assemble_context": "Assemble context",
    "load_skills": "Load skills",
    "plan": "Plan",
    "policy": "Policy",
    "tools": "Tools",
    "hitl": "Human approval",
    "trace": "Trace",
}
GLOBALS = {
    "LEVEL_LABEL": LEVEL_LABEL,
    "STEP_LABEL": STEP_LABEL,
    "FINAL_STATES": frozenset(s.value for s in FINAL),
}
