"""Provider-neutral ToolSpecs into the OpenAI and Anthropic tool formats, and names back (SPEC T2).

Skill ids such as ``orders.lookup`` are not valid tool names for either API (both accept only
``[A-Za-z0-9_-]{1,64}``), so every request carries a ToolNames table: skill id → wire name, built
deterministically from the request's tools, and used to map the model's tool calls back. A call to a
name that is not in the table is the model's mistake and is reported as such, never guessed at.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from harness.domain.errors import ProviderError
from harness.domain.llm import LLMRequest, ToolCallOut, ToolSpec
from harness.domain.plans import Plan

WIRE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SUBMIT_PLAN = "submit_plan"
_DROPPED_KEYS = ("$schema", "$id")  # metadata the APIs do not need and some servers reject


class ToolNames:
    """The two-way mapping between tool names (skill ids) and the names sent on the wire."""

    def __init__(self, names: Iterable[str]) -> None:
        self._to_wire: dict[str, str] = {}
        self._from_wire: dict[str, str] = {}
        for name in names:
            wire = _readable(name)
            if not WIRE_NAME.match(wire) or wire in self._from_wire:
                wire = _hashed(name)
            self._to_wire[name] = wire
            self._from_wire[wire] = name

    def wire(self, name: str) -> str:
        """The wire name of a tool."""
        return self._to_wire[name]

    def name(self, wire: str) -> str:
        """The tool a wire name stands for; a ProviderError when the model invented it."""
        try:
            return self._from_wire[wire]
        except KeyError:
            raise ProviderError(f"the model called tool {wire!r}, which was not offered "
                                f"(offered: {sorted(self._from_wire)})", kind="malformed_response",
                                retryable=False) from None


def malformed(provider: str, what: str) -> ProviderError:
    """The provider answered, but not with something we can use; retrying the same call will not help."""
    return ProviderError(f"{provider}: malformed response: {what}", kind="malformed_response",
                         retryable=False)


def _readable(name: str) -> str:
    return name.replace(".", "__")


def _hashed(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:55]
    return f"{stem}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def object_schema(spec: ToolSpec) -> dict[str, Any]:
    """The tool's argument schema as both APIs want it: a JSON Schema object at the top."""
    schema = {k: v for k, v in spec.parameters.items() if k not in _DROPPED_KEYS}
    kind = schema.setdefault("type", "object")
    if kind != "object":
        raise ValueError(f"tool {spec.name!r}: arguments must be a JSON object schema, not type {kind!r}")
    schema.setdefault("properties", {})
    return schema


def to_openai(spec: ToolSpec, names: ToolNames) -> dict[str, Any]:
    """One tool as an OpenAI chat-completions function tool (`ChatCompletionToolParam`)."""
    function: dict[str, Any] = {"name": names.wire(spec.name), "parameters": object_schema(spec)}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def to_anthropic(spec: ToolSpec, names: ToolNames) -> dict[str, Any]:
    """One tool as an Anthropic messages tool (`anthropic.types.ToolParam`)."""
    tool: dict[str, Any] = {"name": names.wire(spec.name), "input_schema": object_schema(spec)}
    if spec.description:
        tool["description"] = spec.description
    return tool


def submit_plan_spec() -> ToolSpec:
    """The tool a model may call to hand over its plan (plan_mode "tool"): its arguments are the Plan."""
    return ToolSpec(name=SUBMIT_PLAN, description="Submit the plan that answers the user's task.",
                    parameters=Plan.model_json_schema(by_alias=True))


def parse_tool_calls(provider: str, names: ToolNames,
                     raw: list[tuple[str, str, Any]]) -> list[ToolCallOut]:
    """(id, wire name, decoded arguments) from a provider as ToolCallOuts; refuses unknown tools and
    arguments that are not a JSON object."""
    calls: list[ToolCallOut] = []
    for call_id, wire, arguments in raw:
        if not isinstance(arguments, dict):
            raise malformed(provider, f"arguments of tool call {wire!r} are not a JSON object: "
                                      f"{arguments!r:.120}")
        calls.append(ToolCallOut(id=call_id or f"call_{len(calls)}", name=names.name(wire),
                                 arguments=arguments))
    return calls


def plan_from_submit(request: LLMRequest, content: str,
                     calls: list[ToolCallOut]) -> tuple[str, list[ToolCallOut]]:
    """A `submit_plan` call in a planning answer is the plan: its arguments become the content."""
    submitted = [c for c in calls if c.name == SUBMIT_PLAN]
    if request.purpose != "plan" or not submitted:
        return content, calls
    return json.dumps(submitted[0].arguments), [c for c in calls if c.name != SUBMIT_PLAN]


#: step ids and output keys as the schema asks for them: a plain subset of what a Plan accepts, which
#: keeps a constraining server's grammar small
_SHORT_NAME = "^[a-z][a-z0-9_]{0,15}$"
_REF = {"type": "object", "properties": {"$ref": {"type": "string"}}, "required": ["$ref"],
        "additionalProperties": False}


def plan_schema(specs: Iterable[ToolSpec], max_steps: int = 8, *, refs: bool = True) -> dict[str, Any]:
    # the lengths are bounded so that a small model cannot spend its whole answer on one free text
    """The JSON Schema of a Plan that calls only these tools, each with arguments of its own schema (with
    `refs`, any argument may instead be a {"$ref": ...} to an earlier output; llama.cpp's converter reads a
    property named "$ref" as a reference, so for it there are none). Sent as the response format, it lets
    a server that constrains its output (llama.cpp's grammar, OpenAI's structured outputs) return only
    plans of a valid shape; the plan is validated after all the same."""
    calls = []
    for spec in specs:
        arguments = object_schema(spec) if refs else _plain_patterns(object_schema(spec))
        if refs:
            arguments["properties"] = {name: {"anyOf": [prop, _REF]}
                                       for name, prop in arguments.get("properties", {}).items()}
        calls.append({"type": "object", "properties": {"skill": {"const": spec.name}, "arguments": arguments},
                      "required": ["skill", "arguments"], "additionalProperties": False})
    tool_call: dict[str, Any] = {"anyOf": calls} if calls else Plan.model_json_schema()["$defs"]["ToolCall"]
    step = {"type": "object", "properties": {
        "id": {"type": "string", "pattern": _SHORT_NAME},
        "goal": {"type": "string", "maxLength": 40},
        "tool_call": tool_call,
        "depends_on": {"type": "array", "items": {"type": "string", "pattern": _SHORT_NAME}, "maxItems": max_steps},
        "output_key": {"type": "string", "pattern": _SHORT_NAME},
    }, "required": ["id", "goal", "tool_call", "depends_on", "output_key"], "additionalProperties": False}
    return {"type": "object", "properties": {
        "steps": {"type": "array", "items": step, "minItems": 1, "maxItems": max_steps},
        "answer_template": {"type": "string", "maxLength": 100},
    }, "required": ["steps", "answer_template"], "additionalProperties": False}


_CLASSES = {r"\d": "[0-9]", r"\w": "[A-Za-z0-9_]", r"\s": "[ \t\n]"}


def _too_long(key: str, value: Any) -> bool:
    """A length bound llama.cpp spells out one repetition at a time: past a few dozen its grammar parser
    refuses it (and the server stops), so such a bound is left to the skill's own schema check."""
    return key in ("maxLength", "minLength", "maxItems", "minItems") and isinstance(value, int) and value > 32


def _plain_patterns(schema: Any) -> Any:
    """The schema with its regex patterns in the plain form llama.cpp's converter reads: `\\d`, `\\w` and `\\s`
    spelled as classes, and any pattern still holding an escape dropped (a grammar it cannot parse stops
    that server; the arguments are checked against the skill's own schema anyway)."""
    if isinstance(schema, list):
        return [_plain_patterns(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _plain_patterns(v) for k, v in schema.items()
           if not (k == "pattern" and isinstance(v, str)) and not _too_long(k, v)}
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        for escape, cls in _CLASSES.items():
            pattern = pattern.replace(escape, cls)
        if "\\" not in pattern:
            out["pattern"] = pattern
    return out


def tools_in_prompt(specs: Iterable[ToolSpec]) -> str:
    """The tools as text for the system prompt, for a server that does not render a request's tools into
    its prompt (a small local model's chat template)."""
    lines = [f"- {s.name}: {s.description or 'no description'}; arguments: "
             f"{json.dumps(object_schema(s).get('properties', {}), sort_keys=True)}" for s in specs]
    return "\n\nTools you may use (the skill name goes in tool_call.skill):\n" + "\n".join(lines) if lines else ""
