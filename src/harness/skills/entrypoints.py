"""Where a python skill's code comes from, what it is pinned to, and how it is loaded (SPEC T1, amended).

An entrypoint is either a file in the skill's own folder (`skills.py:function`) or a module of an
installed package on the explicit allow-list (`HARNESS_SKILL_PACKAGES`; `mypkg.skills:function`).
Anything else — a path leaving the folder, an absolute path, the standard library, a package not on
the list — is a manifest error naming the entrypoint field, refused before any of its code is imported.

The code is pinned: a file by the SHA-256 of its bytes, a package module by its distribution's name,
version and the SHA-256 of its RECORD (the hashes of every installed file) plus the module's own source.
That pin is part of the skill's manifest_hash, so a Run that started under one version of the code
refuses to run another (manifest_changed). A file is executed from exactly the bytes that were hashed,
and a sandboxed call re-checks the hash inside the sandbox before it runs anything.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.domain.errors import ManifestError


@dataclass(frozen=True)
class Entrypoint:
    """Where a python skill's function lives: a file beside the manifest, or an allowed package's module;
    `sha256` is the digest of the code that was checked (the file's bytes, or the module's source)."""

    function: str
    file: Path | None = None
    module: str | None = None
    sha256: str | None = None
    #: what the manifest hash covers besides the manifest: the code's pin
    pin: tuple[tuple[str, str], ...] = ()
    #: sys.path entries a sandboxed call needs first (a code skill's root, and the harness package's)
    python_path: tuple[Path, ...] = ()
    #: folders or files a sandboxed call must see besides the Python installation (read-only)
    code_paths: tuple[Path, ...] = ()


def _field(manifest_path: Path, message: str) -> ManifestError:
    return ManifestError(f"{manifest_path}: entrypoint: {message}")


def locate(manifest_path: Path, entrypoint: str, packages: Sequence[str]) -> Entrypoint:
    """Resolve and pin an entrypoint without running any of its code; ManifestError when it is not
    confined to the skill's folder or an allowed package, or cannot be found."""
    target, function = entrypoint.rsplit(":", 1)
    if target.endswith(".py"):
        return _locate_file(manifest_path, target, function)
    return _locate_module(manifest_path, target, function, packages)


def _locate_file(manifest_path: Path, target: str, function: str) -> Entrypoint:
    folder = manifest_path.parent.resolve()
    if Path(target).is_absolute():
        raise _field(manifest_path, f"{target!r} is an absolute path; a skill's file must be in its folder {folder}")
    file = (folder / target).resolve()  # symlinks followed: a link out of the folder is outside too
    if not file.is_relative_to(folder):
        raise _field(manifest_path, f"{target!r} is outside the skill's folder {folder}")
    try:
        source = file.read_bytes()
    except OSError as exc:
        raise _field(manifest_path, f"cannot read {file}: {exc.strerror}") from exc
    digest = hashlib.sha256(source).hexdigest()
    return Entrypoint(function, file=file, sha256=digest,
                      pin=(("file", file.relative_to(folder).as_posix()), ("sha256", digest)))


def _locate_module(manifest_path: Path, module: str, function: str, packages: Sequence[str]) -> Entrypoint:
    top = module.split(".", 1)[0]
    if top not in packages:
        allowed = ", ".join(packages) if packages else "none"
        raise _field(manifest_path, f"module {module!r} is neither a file in the skill's folder nor in an allowed "
                                    f"package (HARNESS_SKILL_PACKAGES: {allowed})")
    dists = importlib.metadata.packages_distributions().get(top, [])
    if not dists:
        raise _field(manifest_path, f"package {top!r} is allowed but not an installed distribution")
    dist = importlib.metadata.distribution(dists[0])
    record = dist.read_text("RECORD") or ""
    try:
        spec = importlib.util.find_spec(module)  # imports the (allowed) parent packages, not the module
    except (ImportError, ValueError) as exc:
        raise _field(manifest_path, f"cannot find module {module!r}: {exc}") from exc
    if spec is None:
        raise _field(manifest_path, f"cannot find module {module!r}")
    source = Path(spec.origin).read_bytes() if spec.origin and Path(spec.origin).is_file() else b""
    digest = hashlib.sha256(source).hexdigest()
    pin = (("module", module), ("distribution", dist.metadata["Name"] or dists[0]), ("version", dist.version),
           ("record_sha256", hashlib.sha256(record.encode()).hexdigest()), ("source_sha256", digest))
    return Entrypoint(function, module=module, sha256=digest, pin=pin)


def check_defined(manifest_path: Path, entry: Entrypoint) -> None:
    """For a sandboxed skill (never imported outside its sandbox): its file parses and defines the
    function. A module was found when it was located."""
    if entry.file is None:
        return
    import ast

    try:
        tree = ast.parse(entry.file.read_bytes(), str(entry.file))
    except SyntaxError as exc:
        raise _field(manifest_path, f"{entry.file} is not valid Python: {exc}") from exc
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if entry.function not in defined:
        raise _field(manifest_path, f"{entry.file.name} defines no function {entry.function!r}")


def load(manifest_path: Path, skill_id: str, entry: Entrypoint) -> Callable[..., Any]:
    """Import the entrypoint (a file from exactly the bytes that were hashed) and return its function.
    Whatever the module does at import — raise, or even call sys.exit — is a ManifestError on one line
    naming the skill; a module whose code changed since it was located is refused."""
    try:
        module = _import_file(entry) if entry.file is not None else importlib.import_module(entry.module or "")
    except ManifestError:
        raise
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # SystemExit too: a skill's import must not end the process
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        what = entry.file.name if entry.file is not None else entry.module
        raise ManifestError(f"{manifest_path}: skill {skill_id}: entrypoint: importing {what} raised "
                            f"{type(exc).__name__}: {first}".rstrip(": ")) from exc
    fn = getattr(module, entry.function, None)
    if not callable(fn):
        raise _field(manifest_path, f"{entry.file or entry.module}: has no function {entry.function!r}")
    return fn  # type: ignore[no-any-return]


def _import_file(entry: Entrypoint) -> Any:
    assert entry.file is not None and entry.sha256 is not None
    # one module per file content: a changed file is a new module, never the stale one from sys.modules
    name = f"harness_skill_{hashlib.sha256(str(entry.file).encode()).hexdigest()[:12]}_{entry.sha256[:12]}"
    module = sys.modules.get(name)
    if module is not None:
        return module
    source = entry.file.read_bytes()
    if hashlib.sha256(source).hexdigest() != entry.sha256:
        raise ManifestError(f"{entry.file}: changed while it was being loaded; load the skills again")
    spec = importlib.util.spec_from_file_location(name, entry.file)
    if spec is None:
        raise ManifestError(f"{entry.file}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(source, str(entry.file), "exec"), module.__dict__)  # exactly the bytes that were hashed
    except BaseException:
        del sys.modules[name]  # a broken file must not be found half-loaded next time
        raise
    return module
