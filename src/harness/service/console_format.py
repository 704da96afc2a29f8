"""How the console shows values: badges for states, human durations and times, compact arguments."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from harness.domain.traces import policy_verdicts
from harness.kernel import FINAL, RunState
from harness.kernel.projection import job_status
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


def money(usd: float) -> str:
    """US dollars with enough precision for LLM costs."""
    return f"${usd:,.4f}" if usd < 1 else f"${usd:,.2f}"


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
