"""Skill manifests (SPEC T1): a broken manifest is refused at load with its file and field named, the
manifest hash is pinned at Run start and recorded, and an upgrade mid-Run is refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import ManifestError, SkillsUnavailableError
from harness.settings import Settings
from harness.skills.manifests import SkillRegistry, load_manifest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}

GOOD: dict[str, Any] = {
    "id": "test.good", "version": "1.0.0", "entrypoint": "code.py:work",
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "risk": {"access": "read"},
}
CODE = "def work(args, ctx):\n    return {'n': args.get('n', 0)}\n"


def folder_with(tmp_path: Path, manifests: dict[str, Any], code: str = CODE) -> Path:
    folder = tmp_path / "skills"
    folder.mkdir(exist_ok=True)
    (folder / "code.py").write_text(code)
    for name, content in manifests.items():
        text = content if isinstance(content, str) else yaml.safe_dump(content)
        (folder / name).write_text(text)
    return folder


def refusal(path: Path) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    return str(caught.value)


def test_a_good_manifest_loads_with_its_hash(tmp_path: Path) -> None:
    """A valid manifest loads, imports its function, and hashes its content (64 hex chars)."""
    folder = folder_with(tmp_path, {"good.yaml": GOOD})
    skill = load_manifest(folder / "good.yaml")
    assert skill.id == "test.good" and skill.fn({"n": 3}, None) == {"n": 3}  # type: ignore[arg-type]
    assert re.fullmatch(r"[0-9a-f]{64}", skill.manifest_hash)
    assert skill.manifest.call_kind == "local"


def test_the_model_sees_the_input_schema_without_its_annotations(tmp_path: Path) -> None:
    """`x-currency` is for the approval card: the tool spec offered to a model carries the schema without
    `x-` keywords, while a property named `x-...`, a default and the arguments' validation are untouched."""
    schema = {"type": "object", "x-note": "for people", "properties": {
        "amount": {"type": "number", "x-currency": "EUR"},
        "x-trace": {"type": "string", "default": {"x-kept": 1}}}}
    folder = folder_with(tmp_path, {"pay.yaml": {**GOOD, "input_schema": schema}})
    skill = load_manifest(folder / "pay.yaml")
    assert skill.tool_spec.parameters == {"type": "object", "properties": {
        "amount": {"type": "number"}, "x-trace": {"type": "string", "default": {"x-kept": 1}}}}
    assert skill.manifest.input_schema["properties"]["amount"]["x-currency"] == "EUR"


BROKEN: list[tuple[str, Any, str]] = [
    ("bad_yaml", "id: [unclosed\n", "not valid YAML"),
    ("not_a_mapping", "- just\n- a list\n", "mapping"),
    ("missing_schema", {k: v for k, v in GOOD.items() if k != "input_schema"}, "input_schema"),
    ("missing_risk", {k: v for k, v in GOOD.items() if k != "risk"}, "risk"),
    ("bad_schema", {**GOOD, "input_schema": {"type": "object", "properties": {"n": {"type": "nope"}}}},
     "input_schema"),
    ("schema_not_object", {**GOOD, "input_schema": {"type": "string"}}, "input_schema"),
    ("bad_id", {**GOOD, "id": "Test-Good"}, "id"),
    ("bad_version", {**GOOD, "version": "one"}, "version"),
    ("unknown_field", {**GOOD, "colour": "blue"}, "colour"),
    ("bad_risk", {**GOOD, "risk": {"access": "delete"}}, "risk.access"),
    ("bad_retry", {**GOOD, "retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ("bad_limits", {**GOOD, "sandbox": True, "limits": {"memroy_mb": 64}}, "limits.memroy_mb"),
    ("no_entrypoint", {k: v for k, v in GOOD.items() if k != "entrypoint"}, "entrypoint"),
    ("llm_without_prompt", {**{k: v for k, v in GOOD.items() if k != "entrypoint"}, "kind": "llm"}, "prompt"),
    ("network_unsandboxed", {**GOOD, "network": True}, "network"),
    ("own_fallback", {**GOOD, "fallback": "test.good"}, "fallback"),
    ("missing_file", {**GOOD, "entrypoint": "nowhere.py:work"}, "entrypoint"),
    ("missing_function", {**GOOD, "entrypoint": "code.py:absent"}, "entrypoint"),
    ("missing_module", {**GOOD, "entrypoint": "no_such_module_here:work"}, "entrypoint"),
    ("sandboxed_missing_function", {**GOOD, "sandbox": True, "entrypoint": "code.py:absent"}, "entrypoint"),
    ("sandboxed_missing_file", {**GOOD, "sandbox": True, "entrypoint": "gone.py:work"}, "entrypoint"),
    ("outside_the_folder", {**GOOD, "entrypoint": "../outside/evil.py:fn"}, "outside the skill's folder"),
    ("absolute_path", {**GOOD, "entrypoint": "/etc/evil.py:fn"}, "absolute path"),
    ("standard_library", {**GOOD, "entrypoint": "os.path:basename"}, "HARNESS_SKILL_PACKAGES"),
    ("unlisted_package", {**GOOD, "entrypoint": "jsonschema.validators:validate"}, "HARNESS_SKILL_PACKAGES"),
    ("sandboxed_outside", {**GOOD, "sandbox": True, "entrypoint": "../outside/evil.py:fn"}, "outside"),
]


@pytest.mark.parametrize(("name", "content", "field"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_manifest_is_refused_naming_file_and_field(tmp_path: Path, name: str, content: Any,
                                                             field: str) -> None:
    """Every kind of broken manifest raises ManifestError whose message names the file and the field."""
    folder = folder_with(tmp_path, {f"{name}.yaml": content})
    message = refusal(folder / f"{name}.yaml")
    assert message.startswith(str(folder / f"{name}.yaml"))
    assert field in message


def test_a_broken_skill_file_is_refused_at_load(tmp_path: Path) -> None:
    """A skill file that does not compile is named in the refusal, sandboxed or not."""
    sandboxed = {**GOOD, "id": "test.sbx", "sandbox": True}
    folder = folder_with(tmp_path, {"good.yaml": GOOD, "sbx.yaml": sandboxed}, code="def work(args, ctx:\n")
    for manifest in ("good.yaml", "sbx.yaml"):
        message = refusal(folder / manifest)
        assert "entrypoint" in message and "code.py" in message


def test_a_sandboxed_skill_is_not_imported_at_load(tmp_path: Path) -> None:
    """Loading a sandboxed manifest never runs the skill's module code outside the sandbox."""
    marker = tmp_path / "ran.txt"
    code = f"open({str(marker)!r}, 'w').write('module code ran')\n" + CODE
    folder = folder_with(tmp_path, {"sbx.yaml": {**GOOD, "id": "test.sbx", "sandbox": True}}, code=code)
    skill = load_manifest(folder / "sbx.yaml")
    assert skill.manifest.call_kind == "sandbox" and not marker.exists()
    with pytest.raises(RuntimeError, match="tool controller"):
        skill.fn({}, None)  # type: ignore[arg-type]


def test_duplicate_ids_are_refused_naming_both_files(tmp_path: Path) -> None:
    """Two manifests declaring one id are refused; the message names both files and the id field."""
    folder = folder_with(tmp_path, {"a.yaml": GOOD, "b.yaml": {**GOOD, "version": "2.0.0"}})
    with pytest.raises(ManifestError) as caught:
        SkillRegistry.from_dirs(folder)
    message = str(caught.value)
    assert "b.yaml: id:" in message and "a.yaml" in message


def test_an_unknown_fallback_is_refused(tmp_path: Path) -> None:
    """A fallback naming no declared skill is refused with the file and the fallback field."""
    folder = folder_with(tmp_path, {"a.yaml": {**GOOD, "fallback": "test.missing"}})
    with pytest.raises(ManifestError, match=r"a\.yaml: fallback: no skill 'test\.missing'"):
        SkillRegistry.from_dirs(folder)


def test_a_fallback_needing_more_approval_is_refused(tmp_path: Path) -> None:
    """A fallback may not need a higher approval level than its primary (it runs under the primary's)."""
    risky = {**GOOD, "id": "test.risky", "risk": {"access": "write", "space": "production"}}
    folder = folder_with(tmp_path, {"a.yaml": {**GOOD, "fallback": "test.risky"}, "b.yaml": risky})
    with pytest.raises(ManifestError, match=r"a\.yaml: fallback: 'test\.risky' needs approval level L4"):
        SkillRegistry.from_dirs(folder)


def test_a_missing_skills_folder_is_refused(tmp_path: Path) -> None:
    """Pointing at a folder that does not exist is a ManifestError naming it."""
    with pytest.raises(ManifestError, match="does not exist"):
        SkillRegistry.from_dirs(tmp_path / "nope")


def skills_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "skills"
    folder.mkdir()
    for source in (FIXTURES / "skills").iterdir():
        (folder / source.name).write_text(source.read_text())
    return folder


def settings(tmp_path: Path, skills: Path) -> Settings:
    return Settings(db=str(tmp_path / "rt.db"), skills_dirs=(skills,), policy_file=FIXTURES / "policy.yaml",
                    llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                    data_dir=tmp_path / "data")


def test_the_hash_is_pinned_at_start_and_recorded(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """The Run's context pins each visible skill's manifest hash and every ToolTrace carries it."""
    rt = build_runtime(settings(tmp_path, skills_copy(tmp_path)), clock=clock)
    try:
        result = rt.runs.create_run({"task": "echo hi", **TESTER})
        assert result.state == "SUCCEEDED"
        echo = rt.registry.get("test.echo")
        assert echo is not None
        pinned = rt.store.get_run(result.run_id).context or {}
        assert pinned["manifests"]["test.echo"] == {"version": "1.0.0", "hash": echo.manifest_hash}
        rt.store.drain_all()
        tools = [r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "tool"]
        assert [t["manifest_hash"] for t in tools] == [echo.manifest_hash]
    finally:
        rt.close()


def test_an_upgrade_mid_run_is_refused(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """A Run that started under one manifest version refuses to run the skill after an upgrade: an approval
    the upgraded process would drive is refused before it is recorded (naming the skill, the request still
    pending); one recorded without driving and then driven there has its step refused with
    manifest_changed, the Run fails, and the upgraded skill never runs."""
    skills = skills_copy(tmp_path)
    first = build_runtime(settings(tmp_path, skills), clock=clock)
    try:
        parked = first.runs.create_run({"task": "update T-7", **TESTER})
        assert parked.state == "AWAITING_HITL"
    finally:
        first.close()
    manifest = skills / "write_project.yaml"
    manifest.write_text(manifest.read_text().replace("version: 1.0.0", "version: 1.1.0"))
    upgraded = build_runtime(settings(tmp_path, skills), clock=clock)
    try:
        request_id = parked.approval_request_id or ""
        with pytest.raises(SkillsUnavailableError, match=r"changed since the Run started: test\.update\)"):
            upgraded.runs.decide(request_id, CallerIdentity(**TESTER), "approve")
        assert upgraded.hitl.get(request_id).status == "pending"
        assert upgraded.store.get_run(parked.run_id).state.value == "AWAITING_HITL"
        verdict, _ = upgraded.runs.decide(request_id, CallerIdentity(**TESTER), "approve", resume=False)
        assert verdict.accepted
        done = upgraded.runs.drive(parked.run_id)
        assert done.state == "CLOSED_FAILED" and "manifest_changed" in (done.error or "")
        upgraded.store.drain_all()
        tools = [r.data() for r in upgraded.store.trace_of(parked.run_id) if r.kind == "tool"]
        assert [(t["status"], t["error_code"]) for t in tools] == [("refused", "manifest_changed")]
        assert call_log.read_text() == ""
    finally:
        upgraded.close()


EVIL = "open({marker!r}, 'w').write('outside code ran')\ndef fn(args, ctx):\n    return {{}}\n"


def test_an_entrypoint_outside_the_folder_is_refused_before_its_code_runs(tmp_path: Path) -> None:
    """`../outside/evil.py:fn`, a symlink out of the folder and `os.path:basename` are manifest errors
    naming the entrypoint field; none of the outside code is imported or executed."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "evil.py").write_text(EVIL.format(marker=str(marker)))
    folder = folder_with(tmp_path, {"up.yaml": {**GOOD, "entrypoint": "../outside/evil.py:fn"},
                                    "link.yaml": {**GOOD, "entrypoint": "linked.py:fn"},
                                    "std.yaml": {**GOOD, "entrypoint": "os.path:basename"}})
    (folder / "linked.py").symlink_to(tmp_path / "outside" / "evil.py")
    for name in ("up.yaml", "link.yaml", "std.yaml"):
        message = refusal(folder / name)
        assert message.startswith(f"{folder / name}: entrypoint: "), message
    assert not marker.exists()
    with pytest.raises(ManifestError, match=r"\.yaml: entrypoint: .* is outside the skill.s folder"):
        SkillRegistry.from_dirs(folder)
    assert not marker.exists()


def fake_distribution(root: Path, version: str, code: str) -> None:
    """An installed distribution `acme-skills` (package `acme_skills`) in `root`, as pip leaves one."""
    package = root / "acme_skills"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(code)
    info = root / f"acme_skills-{version}.dist-info"
    for old in root.glob("acme_skills-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: acme-skills\nVersion: {version}\n")
    (info / "top_level.txt").write_text("acme_skills\n")
    (info / "RECORD").write_text(f"acme_skills/__init__.py,,\nacme_skills/tools.py,sha256={version},\n"
                                 f"{info.name}/RECORD,,\n")


def test_a_module_of_an_allowed_installed_package_is_pinned_to_its_distribution(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its package on the allow-list, `acme_skills.tools:work` loads; its manifest hash changes with
    the distribution's version (and RECORD) and with the module's source; off the list it is refused."""
    import sys

    site = tmp_path / "site"
    fake_distribution(site, "1.0", CODE)
    monkeypatch.syspath_prepend(str(site))
    folder = folder_with(tmp_path, {"pkg.yaml": {**GOOD, "entrypoint": "acme_skills.tools:work"}})
    assert "HARNESS_SKILL_PACKAGES" in refusal(folder / "pkg.yaml")
    first = load_manifest(folder / "pkg.yaml", packages=("acme_skills",))
    assert first.fn({"n": 2}, None) == {"n": 2}  # type: ignore[arg-type]
    assert first.entry is not None and dict(first.entry.pin)["version"] == "1.0"
    fake_distribution(site, "1.1", CODE)
    upgraded = load_manifest(folder / "pkg.yaml", packages=("acme_skills",))
    assert upgraded.manifest_hash != first.manifest_hash
    sys.modules.pop("acme_skills.tools", None)
    fake_distribution(site, "1.1", CODE.replace("0)", "1)"))
    edited = load_manifest(folder / "pkg.yaml", packages=("acme_skills",))
    assert edited.manifest_hash not in (first.manifest_hash, upgraded.manifest_hash)


def test_the_manifest_hash_covers_the_entrypoints_code(tmp_path: Path) -> None:
    """Changing the skill's Python file changes the manifest hash, and the new code is what runs;
    restoring it restores the hash."""
    folder = folder_with(tmp_path, {"good.yaml": GOOD})
    before = load_manifest(folder / "good.yaml")
    (folder / "code.py").write_text(CODE.replace("args.get('n', 0)", "-1"))
    after = load_manifest(folder / "good.yaml")
    assert after.manifest_hash != before.manifest_hash
    assert after.fn({"n": 3}, None) == {"n": -1} and before.fn({"n": 3}, None) == {"n": 3}  # type: ignore[arg-type]
    (folder / "code.py").write_text(CODE)
    assert load_manifest(folder / "good.yaml").manifest_hash == before.manifest_hash


@pytest.mark.parametrize(("code", "error"), [
    ("raise RuntimeError('the ledger is not configured')\n", "RuntimeError: the ledger is not configured"),
    ("import sys\nsys.exit(7)\n", "SystemExit: 7"),
    ("raise SystemExit\n", "SystemExit"),
])
def test_a_skill_module_that_fails_at_import_is_one_manifest_error(tmp_path: Path, code: str, error: str) -> None:
    """Whatever a skill's module does at import (raise, exit), loading it is a ManifestError on one line
    naming the manifest, the skill and the error; the process is not ended."""
    folder = folder_with(tmp_path, {"good.yaml": GOOD}, code=code + CODE)
    message = refusal(folder / "good.yaml")
    assert "\n" not in message
    assert message.startswith(f"{folder / 'good.yaml'}: skill test.good: entrypoint: importing code.py raised ")
    assert message.endswith(error)
