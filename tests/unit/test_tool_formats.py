"""Skill schemas in the OpenAI and Anthropic tool formats, checked against the official SDKs' types (T2)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionToolParam
from pydantic import TypeAdapter

from harness.adapters.llm.tool_formats import (
    WIRE_NAME,
    ToolNames,
    object_schema,
    submit_plan_spec,
    to_anthropic,
    to_openai,
)
from harness.domain.errors import ProviderError
from harness.domain.llm import ToolSpec
from harness.examples.support import EXAMPLE_DIR
from harness.pipeline.tool_controller import ToolController
from harness.skills.manifests import SkillRegistry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OPENAI_TOOL: TypeAdapter[Any] = TypeAdapter(ChatCompletionToolParam)


@functools.cache
def anthropic_tool() -> TypeAdapter[Any]:
    """The anthropic SDK's ToolParam, imported on first use: the SDK takes ~1.5 s to import, which every
    pytest worker would pay while collecting this module."""
    import anthropic.types

    return TypeAdapter(anthropic.types.ToolParam)


def all_specs() -> list[ToolSpec]:
    """Every skill shipped in the example and the test fixtures, plus the submit_plan tool."""
    registry = SkillRegistry.from_dirs(EXAMPLE_DIR / "skills", FIXTURES / "skills")
    return [*ToolController.tool_specs(registry.all()), submit_plan_spec()]


def conforms(adapter: TypeAdapter[Any], tool: dict[str, Any]) -> bool:
    """The SDK type accepts the tool and keeps all of it: TypedDicts silently drop unknown keys, so a
    misspelt field would validate yet vanish — equality after validation catches that."""
    return bool(adapter.validate_python(tool) == tool)


def test_every_skill_converts_to_a_valid_openai_tool() -> None:
    """Each skill becomes a ChatCompletionToolParam the SDK accepts whole, with a legal function name."""
    specs = all_specs()
    names = ToolNames(s.name for s in specs)
    assert len(specs) > 5
    for spec in specs:
        tool = to_openai(spec, names)
        assert conforms(OPENAI_TOOL, tool), spec.name
        assert WIRE_NAME.match(tool["function"]["name"])
        assert tool["function"]["parameters"]["type"] == "object"


def test_every_skill_converts_to_a_valid_anthropic_tool() -> None:
    """Each skill becomes an anthropic ToolParam the SDK accepts whole, with an object input_schema."""
    specs = all_specs()
    names = ToolNames(s.name for s in specs)
    for spec in specs:
        tool = to_anthropic(spec, names)
        assert conforms(anthropic_tool(), tool), spec.name
        assert WIRE_NAME.match(tool["name"]) and tool["input_schema"]["type"] == "object"


def test_the_sdk_check_has_teeth() -> None:
    """A tool missing its function, or with a misspelt key, is caught by the same check."""
    good = to_openai(all_specs()[0], ToolNames(s.name for s in all_specs()))
    with pytest.raises(ValueError, match="function"):
        OPENAI_TOOL.validate_python({"type": "function"})
    misspelt = {"type": "function", "function": {**good["function"], "paramaters": {}}}
    assert not conforms(OPENAI_TOOL, misspelt)
    assert not conforms(anthropic_tool(), {"name": "x", "input_schema": {"type": "object"}, "inputs": {}})


def test_schema_metadata_is_dropped_and_non_object_schemas_refused() -> None:
    """$schema/$id are stripped, a missing type becomes object, and a non-object schema is an error."""
    spec = ToolSpec(name="a.b", parameters={"$schema": "https://json-schema.org/draft/2020-12/schema",
                                            "properties": {"x": {"type": "integer"}}})
    assert object_schema(spec) == {"type": "object", "properties": {"x": {"type": "integer"}}}
    with pytest.raises(ValueError, match="JSON object schema"):
        object_schema(ToolSpec(name="a.c", parameters={"type": "array"}))


def test_names_map_to_the_wire_and_back() -> None:
    """Dotted skill ids get legal wire names that map back exactly; clashes and long ids get hashed names."""
    long_id = "a" * 70
    names = ToolNames(["orders.lookup", "orders__lookup", long_id])
    assert names.wire("orders.lookup") == "orders__lookup"
    clash = names.wire("orders__lookup")
    assert clash != "orders__lookup" and WIRE_NAME.match(clash)
    assert WIRE_NAME.match(names.wire(long_id))
    for name in ("orders.lookup", "orders__lookup", long_id):
        assert names.name(names.wire(name)) == name


def test_a_tool_the_model_invented_is_a_malformed_response() -> None:
    """A call to a tool that was not offered is a non-retryable ProviderError naming the tool."""
    names = ToolNames(["orders.lookup"])
    with pytest.raises(ProviderError, match="delete_everything") as info:
        names.name("delete_everything")
    assert info.value.kind == "malformed_response" and not info.value.retryable
