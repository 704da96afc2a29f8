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
output against the output schema.

By default a code skill runs inside the harness process, with all of its privileges: whatever `risk` it
declares, its code can read the process's environment (model API keys, HARNESS_WEBHOOK_SECRET), the
database file (every tenant's Runs and memory) and the checkpoint signing key. Declare it
`@skill(..., sandbox=True)` to run each call out of process, under the same confinement as a YAML skill
with `sandbox: true` (bubblewrap: a cleared environment, only the Python installation, the harness
package, the skill's own package and the Run's working directory visible, no network unless
`network=True`). The sandbox imports the skill's module by name (so the function must be defined at a
module's top level), checks the module's code is the pinned one, and calls the function with the
call's JSON arguments; the result comes back as JSON. The module itself is still imported by whoever
builds the Agent: keep module-level code harmless.
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
from harness.domain.sandbox import Limits
from harness.skills.entrypoints import Entrypoint
from harness.skills.manifests import Manifest, Skill, SkillContext

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
        digest = content_hash({"manifest": manifest.model_dump(mode="json"), "code": source})
        path = Path(inspect.getsourcefile(fn) or f"<{fn.__module__}>")
        if manifest.sandbox:
            self.skill = Skill(manifest, digest, path, _in_the_sandbox, sandbox_entry(fn))
        else:
            self.skill = Skill(manifest, digest, path, self._run)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, as written."""
        return self.fn(*args, **kwargs)

    @property
    def id(self) -> str:
        """The skill id."""
        return self.manifest.id

    def __harness_call__(self, arguments: dict[str, Any], ctx: SkillContext) -> Any:
        """How the sandbox's runner calls it (the YAML skills' convention): as the tool controller would."""
        return self._run(arguments, ctx)

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
          max_attempts: int = 1, fallback: str | None = None, sandbox: bool = False, network: bool = False,
          limits: Limits | dict[str, Any] | None = None) -> Callable[[Callable[..., Any]], CodeSkill]:
    """Declare a function as the skill `id` (see the module docstring). `sandbox`: run each call out of
    process under the sandbox (then `network` and `limits` as in a YAML manifest). A bad declaration
    raises ManifestError naming the function and the field."""
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
                "fallback": fallback, "sandbox": sandbox, "network": network,
                **({"limits": limits} if limits is not None else {}),
            })
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ManifestError(f"{where}: {'.'.join(str(p) for p in err['loc']) or 'manifest'}: "
                                f"{err['msg']}") from None
        if sandbox and "<locals>" in fn.__qualname__:
            raise ManifestError(f"{where}: a sandboxed skill must be defined at a module's top level (the "
                                "sandbox imports it by its module and name)")
        return CodeSkill(fn, manifest, input_model, output, context_param)
    return declare


def _in_the_sandbox(arguments: dict[str, Any], ctx: SkillContext) -> Any:
    raise RuntimeError("a sandboxed code skill runs through the tool controller's sandbox, not in this process")


def sandbox_entry(fn: Callable[..., Any]) -> Entrypoint:
    """How the sandbox reaches a code skill: its module by name (or, for a script run as __main__, its file),
    the sys.path root that module is imported from, and the folders to show inside: the module's top-level
    package and the harness package (the same code as this process, wherever it is installed)."""
    import harness

    where = f"{fn.__module__}.{fn.__qualname__}"
    name = inspect.getsourcefile(fn)
    if name is None or not Path(name).is_file():
        raise ManifestError(f"{where}: a sandboxed skill must be defined in a Python file (it has none)")
    file = Path(name).resolve()
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    own = Path(harness.__file__).resolve().parent
    if fn.__module__ == "__main__":
        return Entrypoint(fn.__name__, file=file, sha256=digest, pin=(("file", file.name), ("sha256", digest)),
                          python_path=(own.parent,), code_paths=(own,))
    parts = fn.__module__.split(".")
    depth = len(parts) if file.name == "__init__.py" else len(parts) - 1
    root = file.parents[depth]
    top = root / parts[0] if len(parts) > 1 or file.name == "__init__.py" else file
    if (root / Path(*parts)).with_suffix(".py") != file and root / Path(*parts) / "__init__.py" != file:
        raise ManifestError(f"{where}: module {fn.__module__} is not importable from {file} (a sandboxed skill's "
                            "module must be importable by its name)")
    return Entrypoint(fn.__name__, module=fn.__module__, sha256=digest,
                      pin=(("module", fn.__module__), ("sha256", digest)),
                      python_path=(root, own.parent), code_paths=(top, own))


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
