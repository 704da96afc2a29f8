"""Rounds of a Run (SPEC K2, rounds): what the model is shown of earlier rounds, and what a round leaves.

A Run plans in rounds. A round is a plan, its policy decision (and approval, when its risk needs one)
and the results of its steps. When a round's plan says `"then": "next_round"`, the Run moves
EXECUTING → PLANNING and the model is shown every completed round (its plan and its results, filtered
for secrets) before it writes the next plan. A completed round is kept in the RunContext under
`rounds`, committed with the EXECUTING → PLANNING transition, so a drive resumed after a crash, an
approval or a restart starts from the next round and never repeats one.

The functions here are pure: the run manager persists what they return.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from harness.domain.contracts import Message

#: the user message that shows the model a round's results starts with this, then the round's number
RESULTS_HEADER = "Results of round"
#: what the model is asked once it has seen the results
NEXT_ROUND_ASK = (
    'Answer with the next JSON plan: more steps (give new step ids and output keys; earlier outputs can be '
    'passed with {"$ref": "<output_key>.<field>"}), with "then": "next_round" to see their results too, '
    '"answer" to have the final answer written from the results, or "finish"; or the final answer as '
    '{"steps": [], "answer": "..."}.'
)
#: the instruction the model gets when it writes the final answer from the results
ANSWER_INSTRUCTIONS = (
    "Write the final answer to the user's task from the results of the steps that ran. Answer in plain "
    "text, using only what the results say; say so when they do not answer the task."
)


def completed(context: dict[str, Any]) -> list[dict[str, Any]]:
    """The completed rounds recorded in a RunContext, oldest first."""
    return list(context.get("rounds", ()))


def number(context: dict[str, Any]) -> int:
    """The number of the round the Run is in (1 for the first)."""
    return len(completed(context)) + 1


def ok_outputs(steps: dict[str, Any]) -> dict[str, Any]:
    """Output key → output of every step that succeeded, from a round's recorded steps."""
    return {o["output_key"]: o["output"] for o in steps.values() if o.get("status") == "ok"}


def earlier_outputs(context: dict[str, Any]) -> dict[str, Any]:
    """The outputs of every completed round, by output key (keys are unique across a Run's rounds)."""
    outputs: dict[str, Any] = {}
    for past in completed(context):
        outputs.update(ok_outputs(past.get("steps", {})))
    return outputs


def taken_names(context: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Step ids and output keys used by completed rounds: a later round may not reuse them, so every
    step of a Run keeps its own idempotency key and every output its own name."""
    ids: set[str] = set()
    keys: set[str] = set()
    for past in completed(context):
        plan = past.get("plan", {})
        ids.update(s["id"] for s in plan.get("steps", ()))
        keys.update(s["output_key"] for s in plan.get("steps", ()))
    return ids, keys


def close_round(context: dict[str, Any], executing_s: float) -> dict[str, Any]:
    """The RunContext for the next round: this round (plan, decision, approval, results, time spent
    executing) appended to `rounds`, the per-round entries cleared."""
    finished = {
        "round": number(context),
        "plan": context["plan"],
        "flattened": bool(context.get("flattened")),
        "policy": context.get("policy"),
        "approval": context.get("approval"),
        "steps": context.get("steps", {}),
        "executing_s": round(executing_s, 6),
    }
    nxt = {k: v for k, v in context.items() if k not in ("plan", "flattened", "policy", "approval", "steps")}
    nxt["rounds"] = [*completed(context), finished]
    nxt["steps"] = {}
    return nxt


def executing_spent(context: dict[str, Any]) -> float:
    """Seconds earlier rounds spent executing: the Run's execution limit counts all its rounds."""
    return sum(float(r.get("executing_s", 0.0)) for r in completed(context))


def results_text(round_no: int, outputs: dict[str, Any], scrub: Callable[[str], str]) -> str:
    """A round's results as the model reads them: JSON by output key, secrets filtered out."""
    body = json.dumps(outputs, sort_keys=True, ensure_ascii=False, default=str)
    return scrub(f"{RESULTS_HEADER} {round_no} (JSON, by output key):\n{body}")


def transcript(context: dict[str, Any], scrub: Callable[[str], str]) -> tuple[Message, ...]:
    """The conversation that follows the task once rounds are done: for each completed round the plan
    the model wrote, then its results; then what the model is asked next."""
    messages: list[Message] = []
    for past in completed(context):
        messages.append(Message(role="assistant", content=scrub(json.dumps(past["plan"], sort_keys=True))))
        outputs = ok_outputs(past.get("steps", {}))
        text = results_text(past["round"], outputs, scrub)
        if past is completed(context)[-1]:
            text += "\n\n" + NEXT_ROUND_ASK
        messages.append(Message(role="user", content=text))
    return tuple(messages)


def answer_messages(task: str, outputs: dict[str, Any], scrub: Callable[[str], str]) -> tuple[Message, ...]:
    """What the model is given to write the final answer: the task and every result (secrets filtered)."""
    body = json.dumps(outputs, sort_keys=True, ensure_ascii=False, default=str)
    return (Message(role="user", content=scrub(task)),
            Message(role="user", content=scrub(f"{RESULTS_HEADER}s (JSON, by output key):\n{body}")))
