"""Skills written in code: the `@skill` decorator (a YAML manifest's equivalent, SPEC T1).

    from pydantic import BaseModel
    from harness import skill

    class Order(BaseModel):
        order_id: str
        status: str

    @skill("orders.lookup", risk="read", idempotent=True, timeout_s=5)
    def lookup_order(order_id: str) -> Order:
        '''Look up an order by its id.'''
        return Order(order_id=order_id, status="shipped")

The input schema comes from the parameters' type hints, the output schema from the return type (both
through Pydantic), the description from the docstring. Risk, idempotency, timeout, retries and a
fallback are arguments. A parameter annotated `SkillContext` receives the call's context (run id, step
id, idempotency key, working directory) and is not part of the input schema.

The manifest hash covers the manifest (schemas included) and the code: the SHA-256 of the file that
defines the function, or of its source when it has no file. A Run pinned to a skill at its start
refuses to call it once either changed. The decorated function stays callable as written (for the
skill's own tests); the tool controller calls it with validated, coerced arguments and checks its
output against the output schema. Code skills run in the process (no sandbox: a skill that must be
isolated is declared by a YAML manifest with `sandbox: true`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from harness.domain.chain import content_hash
from harness.domain.errors import ManifestError
from harness.skills import Manifest, Skill, SkillContext

__all__ = ["CodeSkill", "skill"]

Access = Literal["read", "write"]
Space = Literal["personal", "project", "production"]
Impact = Literal["low", "medium", "high"]


class CodeSkill:
    """A function declared as a skill: call it as the function, or `.skill` for what a registry loads."""

    def __init__(self, fn: Callable[..., Any], manifest: Manifest, input_model: type[BaseModel],
                 output: TypeAdapter[Any] | None, context_param: str | None) -> None:
        self.fn = fn
        self.manifest = manifest
        self.input_model = input_model
        self.output = output
        self.context_param = context_param
        functools.update_wrapper(self, fn)
        source = _source_of(fn)
        self.skill = Skill(manifest, content_hash({"manifest": manifest.model_dump(mode="json"), "code": source}),
                           Path(inspect.getsourcefile(fn) or f"<{fn.__module__}>"), self._run)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, as written."""
        return self.fn(*args, **kwargs)

    @property
    def id(self) -> str:
        """The skill id."""
        return self.manifest.id

    def _run(self, arguments: dict[str, Any], ctx: SkillContext) -> Any:
        """How the tool controller calls it: arguments coerced by the input model, output as JSON data."""
        try:
            parsed = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
            raise ValueError(f"{self.id}: argument {where}: {err['msg']}") from None
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        result = self.fn(**kwargs)
        if self.output is None:
            return result
        try:
            typed = self.output.validate_python(result, from_attributes=True)
        except ValidationError:
            return result  # as returned: the tool controller names how it breaks the output schema
        return self.output.dump_python(typed, mode="json")


def skill(id: str, *, version: str = "1.0.0", description: str | None = None, risk: Access = "read",
          space: Space = "project", impact: Impact = "low", idempotent: bool = False, timeout_s: float = 30.0,
          max_attempts: int = 1, fallback: str | None = None) -> Callable[[Callable[..., Any]], CodeSkill]:
    """Declare a function as the skill `id` (see the module docstring). A bad declaration raises
    ManifestError naming the function and the field."""
    def declare(fn: Callable[..., Any]) -> CodeSkill:
        where = f"{fn.__module__}.{fn.__qualname__}"
        try:
            hints = get_type_hints(fn)
        except Exception as exc:  # an annotation that does not resolve
            raise ManifestError(f"{where}: its type hints cannot be read: {exc}") from exc
        fields: dict[str, Any] = {}
        context_param = None
        for name, param in inspect.signature(fn).parameters.items():
            if hints.get(name) is SkillContext:
                context_param = name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ManifestError(f"{where}: a skill's parameters are named arguments, not *{name}")
            if name not in hints:
                raise ManifestError(f"{where}: parameter {name!r} needs a type hint (it becomes the input schema)")
            default = ... if param.default is param.empty else param.default
            fields[name] = (hints[name], default)
        input_model = create_model(f"{fn.__name__}_input", __config__=ConfigDict(extra="forbid"), **fields)
        returned = hints.get("return")
        output = TypeAdapter(returned) if returned not in (None, type(None)) else None
        output_schema = output.json_schema(mode="serialization") if output is not None else None
        if output_schema is not None and output_schema.get("type") != "object":
            raise ManifestError(f"{where}: the return type must be an object (a Pydantic model, a TypedDict or a "
                                f"dict), so its result has named fields; got {returned!r}")
        try:
            manifest = Manifest.model_validate({
                "id": id, "version": version, "description": description or inspect.getdoc(fn) or "",
                "entrypoint": f"{fn.__module__}:{fn.__name__}", "input_schema": input_model.model_json_schema(),
                "output_schema": output_schema, "risk": {"access": risk, "space": space, "impact": impact},
                "retry": {"max_attempts": max_attempts}, "timeout_s": timeout_s, "idempotent": idempotent,
                "fallback": fallback,
            })
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ManifestError(f"{where}: {'.'.join(str(p) for p in err['loc']) or 'manifest'}: "
                                f"{err['msg']}") from None
        return CodeSkill(fn, manifest, input_model, output, context_param)
    return declare


def _source_of(fn: Callable[..., Any]) -> dict[str, str]:
    """What pins a code skill's code: the SHA-256 of its file, or of its source without one."""
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    if path and Path(path).is_file():
        return {"file": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = fn.__qualname__
    return {"source_sha256": hashlib.sha256(text.encode()).hexdigest()}
