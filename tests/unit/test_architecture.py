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
    """Each module and package at the root is in a layer; a package whose modules sit in different layers
    (the drive: its workers are shells, its state machine is application) has each of them in one."""
    package = ROOT / "src" / "harness"
    layered = _layer_names()
    top = {f"harness.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    missing = sorted(top - layered)
    for folder in (p for p in package.iterdir() if (p / "__init__.py").exists()):
        name = f"harness.{folder.name}"
        if name not in layered:
            missing += [f"{name}.{m.stem}" for m in sorted(folder.glob("*.py"))
                        if m.stem != "__init__" and f"{name}.{m.stem}" not in layered]
    assert not missing, f"modules in no layer of the import contracts (pyproject.toml): {missing}"


#: what the package root holds: the public face (the package itself, the library API, the agent definition,
#: the Celery app operators point their workers at), the composition root with its settings and the read
#: side of it, and the few helpers every layer shares. A new module belongs in the package of its idea.
ROOT_MODULES = {"__init__", "api", "agents", "celery_app", "config", "settings", "stores", "paths", "yamlfile",
                "clock", "timefmt", "local_model"}


def test_the_package_root_holds_only_the_public_face_and_the_composition_root() -> None:
    loose = {p.stem for p in (ROOT / "src" / "harness").glob("*.py")}
    stray = sorted(loose - ROOT_MODULES)
    assert not stray, f"modules at the package root that belong in a package: {stray}"


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


#: the most lines a module of harness may have: past it, a module holds more than one job (split it by
#: responsibility, not by length)
MAX_MODULE_LINES = 450


def test_no_module_is_longer_than_the_limit() -> None:
    """Every module under src/harness has at most MAX_MODULE_LINES lines, so none drifts back into a module
    that does several jobs."""
    package = ROOT / "src" / "harness"
    long = sorted((len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(package)))
                  for p in package.rglob("*.py"))
    offenders = [f"{name} ({lines} lines)" for lines, name in long if lines > MAX_MODULE_LINES]
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility): {offenders}"
