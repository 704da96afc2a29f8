"""The architecture holds in the imports: every module of harness sits in a layer of the import-linter
contracts (pyproject.toml, checked by `lint-imports` in scripts/test.sh), and no import cycle exists."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import cast

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


#: what the package root holds: the public face (the package itself, the library API and the operator's API
#: beside it, the agent definition, the Celery app operators point their workers at), the composition root
#: with its settings and the read side of it, and the few helpers every layer shares. A new module belongs in
#: the package of its idea.
ROOT_MODULES = {"__init__", "api", "operations", "agents", "celery_app", "config", "settings", "stores", "paths",
                "yamlfile", "clock", "timefmt", "local_model"}


def test_the_package_root_holds_only_the_public_face_and_the_composition_root() -> None:
    loose = {p.stem for p in (ROOT / "src" / "harness").glob("*.py")}
    stray = sorted(loose - ROOT_MODULES)
    assert not stray, f"modules at the package root that belong in a package: {stray}"


#: the modules of the shells that work on the runtime itself, not through the library API: the service's
#: composition, its embedded worker (drive machinery) and the spans wrapped around the pipeline's calls
RUNTIME_SIDE = {"harness.service.app", "harness.service.worker", "harness.service.telemetry"}


def test_the_cli_and_the_service_are_faces_over_the_library_api() -> None:
    """The contract that keeps the CLI and the service off the composition root's runtime and the Run manager
    covers both packages whole; only the named runtime-side modules are let through."""
    contract = _contracts()["thin-faces"]
    assert contract["source_modules"] == ["harness.cli", "harness.service"]
    assert set(cast(list[str], contract["forbidden_modules"])) >= {"harness.config", "harness.pipeline.run_manager"}
    ignored = contract.get("ignore_imports", [])
    assert isinstance(ignored, list)
    assert {line.split(" -> ")[0] for line in ignored} <= RUNTIME_SIDE


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


#: the modules that offer names defined elsewhere, on purpose: module -> (the names, None for any; the reason)
PUBLIC_FACES: dict[str, tuple[frozenset[str] | None, str]] = {
    "harness": (None, "the library API, `from harness import Harness, Agent, skill, ...` (README.md, "
                      "docs/guide-your-own-agent.md): names loaded lazily from their homes by `__getattr__`"),
    "harness.stores": (frozenset({"SqlStore", "DatabaseError", "is_outage"}),
                       "the composition root lends the shells the store's type, its database error and its outage "
                       "test, which they may not import from harness.adapters (import-linter contract "
                       "composition-root)"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT / "src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements, with those under a top-level `if` (TYPE_CHECKING) or `try` (optional extras)."""
    found: list[ast.stmt] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        found.append(node)
        if isinstance(node, ast.If | ast.Try):
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            pending += [s for h in getattr(node, "handlers", []) for s in h.body]
    return found


def _bindings(path: Path) -> tuple[dict[str, str], set[str], list[str]]:
    """What a module binds by import (name -> module imported from), what it defines itself, and its
    re-export markers: `__all__` entries that are imported names, `import x as x`, `import *`, a
    module-level `__getattr__`, a module's name bound again under its own name (`Name = module.Name`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: dict[str, str] = {}
    defined: set[str] = set()
    markers: list[str] = []
    exported: list[str] = []
    for node in _top_level(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            source = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            for alias in node.names:
                if alias.name == "*":
                    markers.append(f"`from {source} import *`")
                    continue
                bound = alias.asname or alias.name.split(".")[0]
                imported[bound] = source or alias.name
                if alias.asname is not None and alias.asname == alias.name.rsplit(".", 1)[-1]:
                    markers.append(f"`{alias.name} as {alias.asname}`")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
            if node.name == "__getattr__":
                markers.append("a module-level `__getattr__`")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            defined |= names
            value = node.value
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                    and imported.get(value.value.id, "").startswith("harness")):
                markers += [f"`{name} = {ast.unparse(value)}`" for name in sorted(names) if name == value.attr]
            if "__all__" in names and isinstance(node.value, ast.List | ast.Tuple):
                exported = cast(list[str], [e.value for e in node.value.elts if isinstance(e, ast.Constant)])
    markers += [f"`{name}` in __all__" for name in exported if name in imported and name not in defined]
    return imported, defined, markers


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / "src" / "harness").rglob("*.py")}


def test_no_module_re_exports_a_name_it_imports() -> None:
    """A name has one home: no module under src/harness (but the public faces of PUBLIC_FACES) offers a name
    it imports, by `__all__`, `import x as x`, `import *`, a module-level `__getattr__` or an assignment."""
    offenders = []
    for name, path in sorted(_modules().items()):
        allowed, _reason = PUBLIC_FACES.get(name, (frozenset(), ""))
        offenders += [f"{name}: {marker}" for marker in _bindings(path)[2]
                      if allowed is not None and not any(f"`{a} " in marker or f"`{a}`" in marker for a in allowed)]
    assert not offenders, f"re-exports (import the name from its home instead): {offenders}"


def test_importers_take_each_name_from_its_home() -> None:
    """Code, tests, benchmarks and scripts import a harness name from the module that defines it, not from
    one that merely imports it (an implicit re-export that `__all__` does not show)."""
    modules = _modules()
    bindings = {name: _bindings(path) for name, path in modules.items()}
    offenders = []
    for folder in ("src", "tests", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom) or node.level or node.module not in bindings:
                    continue
                if PUBLIC_FACES.get(node.module, (frozenset(), ""))[0] is None:
                    continue
                imported, defined, _ = bindings[node.module]
                offenders += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} from {node.module} "
                    f"(its home: {imported[a.name]})"
                    for a in node.names
                    if a.name in imported and a.name not in defined and f"{node.module}.{a.name}" not in modules
                ]
    assert not offenders, f"names imported from a module that only re-exports them: {offenders}"
