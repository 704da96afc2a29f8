"""The Run's default execution limit is defined once, in the kernel, and every other default takes it from
there: the settings, the run manager and the sweeper's thresholds cannot drift apart."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from harness.kernel.states import RunState
from harness.kernel.thresholds import DEFAULT_EXECUTION_LIMIT_S, Thresholds
from harness.pipeline.run_manager import RunManager
from harness.settings import Settings

SRC = Path(__file__).resolve().parents[2] / "src" / "harness"
NAME = "execution_limit_s"


def _defaults(node: ast.AST) -> list[tuple[str, ast.expr | None]]:
    """The (name, default) pairs a function's parameters or an annotated attribute declare."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        names = [a.arg for a in positional[len(positional) - len(args.defaults):]]
        return [*zip(names, args.defaults, strict=True),
                *((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True))]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, node.value)]
    return []


def _is_number(default: ast.expr | None) -> bool:
    """Whether a default is a number written out, itself or as Field(default=...)'s."""
    if isinstance(default, ast.Call):
        default = next((k.value for k in default.keywords if k.arg == "default"),
                       default.args[0] if default.args else None)
    return isinstance(default, ast.Constant) and isinstance(default.value, (int, float))


def _literal_defaults(name_: str = NAME) -> list[str]:
    """Every place in the source that gives `name_` a number as its default."""
    return [f"{path.relative_to(SRC)}:{getattr(node, 'lineno', 0)}"
            for path in sorted(SRC.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            for name, default in _defaults(node) if name == name_ and _is_number(default)]


def test_the_execution_limit_default_is_written_once() -> None:
    """No settings field or parameter named execution_limit_s writes its own number: each names the kernel's."""
    assert _literal_defaults() == []


def test_every_default_execution_limit_is_the_kernels() -> None:
    """The settings, the run manager and the sweeper's thresholds all default to the kernel's limit."""
    assert Settings().execution_limit_s == DEFAULT_EXECUTION_LIMIT_S
    assert inspect.signature(RunManager).parameters[NAME].default == DEFAULT_EXECUTION_LIMIT_S
    assert inspect.signature(Thresholds.build).parameters[NAME].default == DEFAULT_EXECUTION_LIMIT_S
    assert Settings().thresholds().threshold(RunState.EXECUTING) == Thresholds.build().threshold(RunState.EXECUTING)


def test_the_chain_depth_and_rounds_defaults_are_written_once() -> None:
    """The same for a Run's child-Run depth and its planning rounds (the settings and the run manager name
    the domain's defaults, and agree) and for the sweep interval (the kernel's)."""
    from harness.domain.contracts import DEFAULT_CHAIN_DEPTH, DEFAULT_MAX_ROUNDS

    assert _literal_defaults("chain_depth") == [] and _literal_defaults("max_rounds") == []
    assert _literal_defaults("sweep_interval_s") == []
    manager = inspect.signature(RunManager.__init__).parameters
    assert manager["chain_depth"].default == Settings().chain_depth == DEFAULT_CHAIN_DEPTH
    assert manager["max_rounds"].default == Settings().max_rounds == DEFAULT_MAX_ROUNDS
