"""The architecture holds in the imports: every module of harness sits in a layer of the import-linter
contracts (pyproject.toml, checked by `lint-imports` in scripts/test.sh), and no import cycle exists."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]

def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _layer_names() -> set[str]:
    layers = _contracts()["layers"]["layers"]
    assert isinstance(layers, list)
    return {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}


def test_every_top_level_module_has_a_layer() -> None:
    package = ROOT / "src" / "harness"
    top = {f"harness.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    top |= {f"harness.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    missing = sorted(top - _layer_names())
    assert not missing, f"modules in no layer of the import contracts (pyproject.toml): {missing}"


def _cycles() -> set[frozenset[str]]:
    graph = grimp.build_graph("harness", cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(start: str) -> None:  # Tarjan's strongly connected components, iteratively
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle() -> None:
    """No module of harness reaches itself through its imports (TYPE_CHECKING and function-local ones too)."""
    cycles = sorted(sorted(c) for c in _cycles())
    assert not cycles, f"import cycles: {cycles}"
