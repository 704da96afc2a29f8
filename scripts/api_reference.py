"""Write docs/api.md, the reference of the Python API, from the code's own docstrings and field comments.

    python scripts/api_reference.py           # (re)write docs/api.md
    python scripts/api_reference.py --check   # exit 1 when docs/api.md is not what the code says

Every public method (with its signature) of `Harness` and `AsyncHarness` and every field of the types they
return is listed; tests/unit/test_api_reference.py regenerates the page and compares, so it cannot drift.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"

HEADER = """# Python API reference

Generated from the docstrings by `python scripts/api_reference.py`; do not edit by hand (a test compares).
`from harness import Harness` (or `AsyncHarness`) is the way in; the guide
(`docs/guide-your-own-agent.md`) shows them at work. Times are epoch seconds (`float`) in these types.
"""


def _classes() -> list[tuple[str, type]]:
    from harness.api import ApprovalRequest, AsyncHarness, DecisionOutcome, Harness, RunEvent, TraceEntry
    from harness.domain.contracts import RunResult
    from harness.replay.facts import Divergence, ReplayReport

    return [("Harness", Harness), ("AsyncHarness", AsyncHarness), ("RunResult", RunResult),
            ("RunEvent", RunEvent), ("TraceEntry", TraceEntry), ("ApprovalRequest", ApprovalRequest),
            ("DecisionOutcome", DecisionOutcome), ("ReplayReport", ReplayReport), ("Divergence", Divergence)]


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def _signature(name: str, fn: Callable[..., Any]) -> str:
    """`name(params) -> returns`, annotations as written in the source."""
    sig = inspect.signature(fn)
    parts, star = [], False
    for p in list(sig.parameters.values())[1:]:  # self
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = {p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, p.name)  # type: ignore[call-overload]
        star = star or p.kind is p.VAR_POSITIONAL
        if p.annotation is not p.empty:
            text += f": {p.annotation}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    returns = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    return f"{name}({', '.join(parts)}){returns}"


def _methods(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties the class itself defines, in source order (the constructor first)."""
    found = []
    for name, member in vars(cls).items():
        generated = name == "__init__" and dataclasses.is_dataclass(cls)
        if (name == "__init__" and not generated) or (
                not name.startswith("_") and (callable(member) or isinstance(member, property))):
            found.append((name, member))
    return found


def _field_comments(cls: type) -> dict[str, str]:
    """The `#:` comment lines just above each annotated field of the class body."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def _fields(cls: type) -> list[tuple[str, str, str]]:
    """(name, type, default) of each field of a Pydantic model or a dataclass."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        out = []
        for name, info in cls.model_fields.items():
            annotation = cls.__annotations__.get(name) or _inherited_annotation(cls, name)
            default = "" if info.is_required() else (
                repr(info.default) if info.default_factory is None else f"{info.default_factory.__name__}()")  # type: ignore[union-attr]
            out.append((name, str(annotation), default))
        return out
    if dataclasses.is_dataclass(cls):
        return [(f.name, str(f.type), _dataclass_default(f)) for f in dataclasses.fields(cls)]
    return []


def _dataclass_default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return f"{f.default_factory.__name__}()"
    return ""


def _inherited_annotation(cls: type, name: str) -> str:
    for base in cls.__mro__:
        if name in getattr(base, "__annotations__", {}):
            return str(base.__annotations__[name])
    return "Any"


def _row(*cells: str) -> str:
    """A table row; a `|` inside a cell (a union type) is escaped."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _section(title: str, cls: type) -> list[str]:
    out = [f"## `{title}`", "", _doc(cls), ""]
    fields = _fields(cls)
    if fields:
        comments = {}
        for klass in reversed(cls.__mro__):
            if klass.__module__.startswith("harness"):
                comments.update(_field_comments(klass))
        out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [_row(f"`{n}`", f"`{t}`", f"`{d}`" if d else "required", comments.get(n, "")) for n, t, d in fields]
        out.append("")
    for name, member in _methods(cls):
        if isinstance(member, property):
            out += [f"### `{title}.{name}` (property)", "", _doc(member.fget), ""]
            continue
        shown = title if name == "__init__" else f"{title}.{name}"
        prefix = "async " if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member) else ""
        out += [f"### `{prefix}{_signature(shown, member)}`", "", _doc(member) or "(no description)", ""]
    return out


def render() -> str:
    """The page as the code describes it now."""
    lines = [HEADER]
    for title, cls in _classes():
        lines += _section(title, cls)
    return "\n".join(lines).rstrip() + "\n"


def undocumented() -> list[str]:
    """Public methods without a docstring and fields without a `#:` comment: what the page would leave blank."""
    missing = []
    for title, cls in _classes():
        comments: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if klass.__module__.startswith("harness"):
                comments.update(_field_comments(klass))
        missing += [f"{title}.{n}" for n, _, _ in _fields(cls) if not comments.get(n)]
        missing += [f"{title}.{n}()" for n, m in _methods(cls)
                    if not _doc(m.fget if isinstance(m, property) else m)]
    return missing


def main(argv: list[str]) -> int:
    """Write the page, or with --check say whether it is current."""
    page = render()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != page:
            sys.stderr.write(f"{PAGE} is out of date: run python scripts/api_reference.py\n")
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
