"""Skill manifests and the registry that loads them (SPEC T1).

A manifest is a YAML file (an amount of money in the input schema names its currency, `x-currency`, which
the console shows with the amount)::

    id: orders.lookup
    version: 1.0.0
    description: Look up an order by id.
    entrypoint: skills.py:lookup_order        # a file in the manifest's folder, or allowed_package.module:function
    input_schema: {type: object, required: [order_id], properties: {order_id: {type: string}}}
    risk: {access: read, space: project, impact: low}
    retry: {max_attempts: 3, backoff_s: 0.2, max_backoff_s: 5}
    timeout_s: 10
    sandbox: false
    network: false
    persistent: false                         # sandboxed only: keep the Run's instance between calls
    ports: 0                                  # sandboxed only: ports leased from the host's pool
    idempotent: true
    fallback: null
    kind: python                              # python (default), llm or agent
    limits: {memory_mb: 512, cpu_s: 10, processes: 64, file_mb: 64, output_kb: 1024}   # sandboxed only
    breaker: {failure_threshold: 5, reset_timeout_s: 30}

An `mcp` skill is not declared in a file: it is one tool of an MCP server named in the deployment's MCP
config (harness.skills.mcp), which sets its schema, risk and hash. An `llm` skill has no entrypoint: its
`prompt` (with ``{argument}`` placeholders) goes to the Runtime's
LLM provider. An `agent` skill's `prompt` becomes the task of a child Run (SPEC T4); its `timeout_s`
bounds the whole child Run, a wait for a human approval included (capped by the parent's remaining time).
A broken manifest is refused at load with the file and the field named.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.domain.chain import content_hash
from harness.domain.contracts import SKILL_ID
from harness.domain.errors import ManifestError
from harness.domain.llm import ToolSpec
from harness.domain.sandbox import Limits
from harness.policy.config import LEVEL_RANK
from harness.policy.risk import Risk, level_for
from harness.skills import entrypoints
from harness.skills.entrypoints import Entrypoint
from harness.yamlfile import read_yaml

__all__ = ["BreakerSettings", "Manifest", "RetryPolicy", "Skill", "SkillContext", "SkillFn", "SkillRegistry",
           "SkillSource", "load_manifest"]


class RetryPolicy(BaseModel):
    """How often and how patiently a failing call is retried (SPEC T3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_attempts: int = Field(default=1, ge=1, le=10)
    backoff_s: float = Field(default=0.2, ge=0, le=60)
    max_backoff_s: float = Field(default=5.0, ge=0, le=600)


class BreakerSettings(BaseModel):
    """When the skill's circuit breaker opens and for how long (SPEC T3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    failure_threshold: int = Field(default=5, ge=1, le=1_000)
    reset_timeout_s: float = Field(default=30.0, ge=0, le=86_400)


CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")


def currency_fields(schema: dict[str, Any]) -> dict[str, str]:
    """The top-level properties of an input schema that are amounts of money, each with its currency: a
    number or integer property annotated `x-currency: EUR` (an ISO 4217 code). A property without the
    annotation has no currency: nothing guesses one."""
    found: dict[str, str] = {}
    for name, prop in (schema.get("properties") or {}).items():
        code = prop.get("x-currency") if isinstance(prop, dict) else None
        if code is None:
            continue
        if not isinstance(code, str) or not CURRENCY_CODE.match(code):
            raise ValueError(f"properties.{name}.x-currency: {code!r} is not an ISO 4217 code such as EUR")
        if prop.get("type") not in ("number", "integer"):
            raise ValueError(f"properties.{name}.x-currency: only a number or integer is an amount of money")
        found[name] = code
    return found


class Manifest(BaseModel):
    """A skill's declaration."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=SKILL_ID)
    version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?([-+][A-Za-z0-9.]+)?$")
    description: str = ""
    kind: Literal["python", "llm", "agent", "mcp"] = "python"
    entrypoint: str | None = Field(default=None, pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$")
    prompt: str | None = Field(default=None, min_length=1, max_length=20_000)
    output: Literal["text", "json"] = "text"
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    risk: Risk
    retry: RetryPolicy = RetryPolicy()
    timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    sandbox: bool = False
    network: bool = False
    #: keep one sandbox instance for the Run: what a call starts there (in a session of its own), its
    #: /tmp and its network namespace are still there at the Run's next call of the skill
    persistent: bool = False
    #: ports leased from the host's pool for the Run's instance, given to the skill as HARNESS_PORTS
    ports: int = Field(default=0, ge=0, le=16)
    idempotent: bool = False
    fallback: str | None = Field(default=None, pattern=SKILL_ID)
    limits: Limits = Limits()
    breaker: BreakerSettings = BreakerSettings()

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(value)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"not a valid JSON Schema: {exc.message}") from exc
            if value.get("type") != "object":
                raise ValueError("must describe an object (type: object)")
            currency_fields(value)
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> Manifest:
        # Each check raises with the field's name first, so the loader's message names it.
        if self.kind == "python" and self.entrypoint is None:
            raise ValueError("entrypoint: a python skill needs one (file.py:function or module:function)")
        if self.kind in ("llm", "agent"):
            if self.prompt is None:
                raise ValueError(f"prompt: an {self.kind} skill needs a prompt")
            if self.entrypoint is not None or self.sandbox:
                raise ValueError(f"kind: an {self.kind} skill has no entrypoint and is not sandboxed")
        if self.kind == "mcp" and (self.entrypoint is not None or self.prompt is not None or self.sandbox):
            raise ValueError("kind: an mcp skill is a tool of an MCP server: no entrypoint, prompt or sandbox")
        if self.network and not self.sandbox:
            raise ValueError("network: only a sandboxed skill declares network access")
        if (self.persistent or self.ports) and not self.sandbox:
            raise ValueError("persistent: only a sandboxed skill keeps an instance or leases ports")
        if self.fallback == self.id:
            raise ValueError("fallback: a skill cannot be its own fallback")
        return self

    @property
    def call_kind(self) -> Literal["local", "sandbox", "llm", "agent", "mcp"]:
        """How the tool controller runs it (SPEC T4)."""
        if self.kind == "python":
            return "sandbox" if self.sandbox else "local"
        return self.kind


@dataclass(frozen=True)
class SkillContext:
    """What a skill receives besides its arguments."""

    run_id: str
    step_id: str
    idempotency_key: str
    tenant_id: str
    user_id: str
    workdir: Path
    #: this database's folder in the data directory (HARNESS_DATA_DIR/<database id>), where a skill may
    #: keep files of its own
    data_dir: Path | None = None


SkillFn = Callable[[dict[str, Any], SkillContext], Any]


def _runs_elsewhere(args: dict[str, Any], ctx: SkillContext) -> Any:
    raise RuntimeError("this skill runs through the tool controller (sandbox, LLM, child Run), not here")


@dataclass(frozen=True)
class Skill:
    """A loaded skill: its manifest, the manifest's hash, and the function that runs it."""

    manifest: Manifest
    manifest_hash: str
    path: Path
    fn: SkillFn
    entry: Entrypoint | None = None

    @property
    def id(self) -> str:
        """The skill id."""
        return self.manifest.id

    def validate_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise jsonschema.ValidationError when the arguments do not fit the input schema."""
        self._arguments_validator.validate(arguments)

    def output_problem(self, output: Any) -> str | None:
        """Why the output does not fit the manifest's output_schema (naming the field), or None when it
        fits or the manifest declares none."""
        if self.manifest.output_schema is None:
            return None
        error = jsonschema.exceptions.best_match(self._output_validator.iter_errors(output))
        if error is None:
            return None
        where = ".".join(str(p) for p in error.absolute_path) or "(the output)"
        return f"{where}: {error.message}"

    @functools.cached_property
    def tool_spec(self) -> ToolSpec:
        """The skill as a provider-neutral tool spec (built once per loaded skill: its manifest is fixed)."""
        return ToolSpec(name=self.id, description=self.manifest.description,
                        parameters=_without_annotations(self.manifest.input_schema))

    @functools.cached_property
    def _output_validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.manifest.output_schema or {})

    @functools.cached_property
    def _arguments_validator(self) -> jsonschema.Draft202012Validator:
        """The input schema, compiled once per loaded skill (a manifest never changes under a Skill)."""
        return jsonschema.Draft202012Validator(self.manifest.input_schema)


def _without_annotations(schema: Any) -> Any:
    """The schema without its `x-` annotations (such as `x-currency`): they are for the people who read an
    approval card, not for the model, and a provider's strict tool-schema mode refuses keywords it does not
    know. A property whose name starts with `x-` is kept (inside `properties` the keys are names), and so
    are values (`enum`, `const`, `default`, `examples`)."""
    if isinstance(schema, list):
        return [_without_annotations(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-"):
            continue
        if key in ("enum", "const", "default", "examples"):
            kept[key] = value  # values, not schemas
        elif key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas") \
                and isinstance(value, dict):
            kept[key] = {name: _without_annotations(sub) for name, sub in value.items()}
        else:
            kept[key] = _without_annotations(value)
    return kept


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    message = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return message  # a cross-field check: its message starts with the field it is about
    return f"{'.'.join(str(p) for p in err['loc'])}: {message}"


def load_manifest(path: Path, packages: Sequence[str] = ()) -> Skill:
    """Load and validate one manifest; import its entrypoint unless it runs in a sandbox. The manifest
    hash covers the manifest and, for a python skill, its code (harness.skills.entrypoints): a change to either
    is a new version that a Run pinned to the old one refuses (T1). `packages` are the installed
    packages whose modules may be entrypoints besides files in the manifest's folder."""
    raw = read_yaml(path, ManifestError)
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: a manifest must be a mapping of fields")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        raise ManifestError(f"{path}: {_first_error(exc)}") from exc
    if manifest.entrypoint is None:
        return Skill(manifest, content_hash(raw), path, _runs_elsewhere)
    entry = entrypoints.locate(path, manifest.entrypoint, packages)
    digest = content_hash({"manifest": raw, "code": dict(entry.pin)})
    if manifest.sandbox:
        # Importing would run the skill's module-level code unsandboxed: only check it is there.
        entrypoints.check_defined(path, entry)
        return Skill(manifest, digest, path, _runs_elsewhere, entry)
    return Skill(manifest, digest, path, entrypoints.load(path, manifest.id, entry), entry)


class SkillSource(Protocol):
    """Skills that are not files: listed when first needed (an MCP server's tools), possibly changing."""

    def skills(self) -> list[Skill]:
        """Every skill the source offers now."""
        ...

    def get(self, skill_id: str) -> Skill | None:
        """The skill with this id as last listed (listing it first if it never was), or None."""
        ...


class SkillRegistry:
    """Every skill found in a set of folders, by id, and those of the skill sources (MCP servers)."""

    def __init__(self, skills: Iterable[Skill], sources: Sequence[SkillSource] = ()) -> None:
        self.sources = tuple(sources)
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            if skill.id in self._skills:
                first = self._skills[skill.id].path
                raise ManifestError(f"{skill.path}: id: {skill.id!r} is already declared by {first}")
            self._skills[skill.id] = skill
        for skill in self._skills.values():
            self._check_fallback(skill)

    def _check_fallback(self, skill: Skill) -> None:
        # The fallback runs under the primary's approval, so it may not need a higher level (G2).
        name = skill.manifest.fallback
        if name is None:
            return
        fallback = self._skills.get(name)
        if fallback is None:
            raise ManifestError(f"{skill.path}: fallback: no skill {name!r} is declared")
        mine, theirs = level_for(skill.manifest.risk), level_for(fallback.manifest.risk)
        if LEVEL_RANK[theirs] > LEVEL_RANK[mine]:
            raise ManifestError(f"{skill.path}: fallback: {name!r} needs approval level {theirs}, "
                                f"higher than {skill.id}'s {mine}")

    @classmethod
    def from_dirs(cls, *dirs: Path, packages: Sequence[str] = ()) -> SkillRegistry:
        """Load every `*.yaml` manifest under the given folders; entrypoints may also be modules of the
        installed `packages` (the allow-list, HARNESS_SKILL_PACKAGES)."""
        skills: list[Skill] = []
        for folder in dirs:
            if not folder.is_dir():
                raise ManifestError(f"{folder}: skills folder does not exist")
            skills.extend(load_manifest(p, packages) for p in sorted(folder.glob("*.yaml")))
        return cls(skills)

    def get(self, skill_id: str) -> Skill | None:
        """The skill with this id, or None."""
        found = self._skills.get(skill_id)
        for source in self.sources:
            if found is not None:
                break
            found = source.get(skill_id)
        return found

    def all(self) -> list[Skill]:
        """Every skill, sorted by id (a source's skills as it lists them now)."""
        skills = dict(self._skills)
        for source in self.sources:
            for skill in source.skills():
                if skill.id in skills:
                    raise ManifestError(f"{skill.path}: {skill.id!r} is already declared by {skills[skill.id].path}")
                skills[skill.id] = skill
        return [skills[k] for k in sorted(skills)]
