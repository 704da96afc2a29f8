"""Skill manifests and the registry that loads them (SPEC T1).

A manifest is a YAML file::

    id: orders.lookup
    version: 1.0.0
    description: Look up an order by id.
    entrypoint: skills.py:lookup_order        # file relative to the manifest, or module.path:function
    input_schema: {type: object, required: [order_id], properties: {order_id: {type: string}}}
    risk: {access: read, space: project, impact: low}
    retry: {max_attempts: 3, backoff_s: 0.2, max_backoff_s: 5}
    timeout_s: 10
    sandbox: false
    network: false
    idempotent: true
    fallback: null

A broken manifest is refused at load with the file and the field named.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.audit.chain import content_hash
from harness.errors import ManifestError
from harness.pipeline.contracts import SKILL_ID


class Risk(BaseModel):
    """What a call can do: read or write, in which resource space, with what impact (SPEC G2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    access: Literal["read", "write"]
    space: Literal["personal", "project", "production"] = "project"
    impact: Literal["low", "medium", "high"] = "low"


class RetryPolicy(BaseModel):
    """How often and how patiently a failing call is retried (SPEC T3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_attempts: int = Field(default=1, ge=1, le=10)
    backoff_s: float = Field(default=0.2, ge=0, le=60)
    max_backoff_s: float = Field(default=5.0, ge=0, le=600)


class Manifest(BaseModel):
    """A skill's declaration."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=SKILL_ID)
    version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?([-+][A-Za-z0-9.]+)?$")
    description: str = ""
    entrypoint: str = Field(pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$")
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    risk: Risk
    retry: RetryPolicy = RetryPolicy()
    timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    sandbox: bool = False
    network: bool = False
    idempotent: bool = False
    fallback: str | None = Field(default=None, pattern=SKILL_ID)
    limits: dict[str, float] = Field(default_factory=dict)

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
        return value


@dataclass(frozen=True)
class SkillContext:
    """What a skill receives besides its arguments."""

    run_id: str
    step_id: str
    idempotency_key: str
    tenant_id: str
    user_id: str
    workdir: Path


SkillFn = Callable[[dict[str, Any], SkillContext], Any]


@dataclass(frozen=True)
class Skill:
    """A loaded skill: its manifest, the manifest's hash, and the function that runs it."""

    manifest: Manifest
    manifest_hash: str
    path: Path
    fn: SkillFn

    @property
    def id(self) -> str:
        """The skill id."""
        return self.manifest.id

    def validate_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise jsonschema.ValidationError when the arguments do not fit the input schema."""
        jsonschema.Draft202012Validator(self.manifest.input_schema).validate(arguments)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{where}: {err['msg']}"


def load_manifest(path: Path) -> Skill:
    """Load and validate one manifest and import its entrypoint."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: a manifest must be a mapping of fields")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        raise ManifestError(f"{path}: {_first_error(exc)}") from exc
    return Skill(manifest, content_hash(raw), path, _import_entrypoint(path, manifest.entrypoint))


def _import_entrypoint(manifest_path: Path, entrypoint: str) -> SkillFn:
    target, func = entrypoint.rsplit(":", 1)
    try:
        if target.endswith(".py"):
            file = (manifest_path.parent / target).resolve()
            name = f"harness_skill_{content_hash(str(file))[:16]}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, file)
                if spec is None or spec.loader is None:
                    raise ManifestError(f"{manifest_path}: entrypoint: cannot load {file}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ManifestError:
        raise
    except (OSError, ImportError, SyntaxError) as exc:
        raise ManifestError(f"{manifest_path}: entrypoint: cannot import {target!r}: {exc}") from exc
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ManifestError(f"{manifest_path}: entrypoint: {target!r} has no function {func!r}")
    return fn  # type: ignore[no-any-return]


class SkillRegistry:
    """Every skill found in a set of folders, by id."""

    def __init__(self, skills: Iterable[Skill]) -> None:
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            if skill.id in self._skills:
                raise ManifestError(f"{skill.path}: id: {skill.id!r} is already declared by {self._skills[skill.id].path}")
            self._skills[skill.id] = skill
        for skill in self._skills.values():
            fallback = skill.manifest.fallback
            if fallback is not None and fallback not in self._skills:
                raise ManifestError(f"{skill.path}: fallback: no skill {fallback!r} is declared")

    @classmethod
    def from_dirs(cls, *dirs: Path) -> SkillRegistry:
        """Load every `*.yaml` manifest under the given folders."""
        skills = []
        for folder in dirs:
            if not folder.is_dir():
                raise ManifestError(f"{folder}: skills folder does not exist")
            skills.extend(load_manifest(p) for p in sorted(folder.glob("*.yaml")))
        return cls(skills)

    def get(self, skill_id: str) -> Skill | None:
        """The skill with this id, or None."""
        return self._skills.get(skill_id)

    def all(self) -> list[Skill]:
        """Every skill, sorted by id."""
        return [self._skills[k] for k in sorted(self._skills)]
