"""What a newcomer meets first, on the command line: the demo leaves a refund waiting for a support lead
and says how to approve it, its confirmed refund cites the policy handbook, JSON times are ISO 8601, the
trace reads in order, output into a pipe is not wrapped, example data stays out of the working folder, and
help texts speak of the product, not of us."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer._click import Command  # Typer's own click (typer._click), not the `click` package: private, no public name
from typer.core import TyperGroup
from typer.testing import CliRunner, Result

from harness.cli import app

#: a requirement id; not Amazon's S3, which users do know (`--s3-endpoint`: "The S3-compatible server …")
SPEC_ID = re.compile(r"\b(SPEC|seed \d+|(?!S3-compatible)[KPGTCASDUN]\d{1,2}[a-z]?)\b")
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


@dataclass
class Demo:
    """The demo, run once in a fresh folder: its database, data directory, working folder and output."""

    db: str
    data_dir: Path
    cwd: Path
    output: str
    env: dict[str, str]

    def cli(self, *args: str, **env: str) -> Result:
        """A harness command on the demo's database, its output captured (not a terminal)."""
        return CliRunner().invoke(app, [*args, "--db", self.db], env={**self.env, **env})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """`harness demo` from a working folder of its own, with the data directory elsewhere."""
    root = tmp_path_factory.mktemp("newcomer")
    cwd = root / "work"
    cwd.mkdir()
    env = {"HARNESS_DATA_DIR": str(root / "data"), "HARNESS_EXAMPLE_LEDGER": "", "HARNESS_MEMORY": "off"}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        mp.delenv("HARNESS_EXAMPLE_LEDGER", raising=False)
        result = CliRunner().invoke(app, ["demo", "--db", str(root / "demo.db")], env=env)
        assert result.exit_code == 0, result.output
        yield Demo(str(root / "demo.db"), root / "data", cwd, result.stdout, env)


def _pending(demo: Demo) -> list[dict[str, Any]]:
    result = demo.cli("approvals", "--json")
    assert result.exit_code == 0, result.output
    pending: list[dict[str, Any]] = json.loads(result.stdout)["pending"]
    return pending


def test_the_demo_leaves_an_l3_refund_for_carol_and_says_how_to_approve_it(demo: Demo) -> None:
    """The demo's L3 refund waits for a support lead; its output says how to approve it in the console and
    on one unbroken command line; carol's approval completes it and the trace reads in step order."""
    pending = _pending(demo)
    assert [(p["level"], p["requester"], p["approver_roles"]) for p in pending] == [("L3", "alice", ["support_lead"])]
    request = pending[0]
    for field in ("deadline_at", "created_at"):
        assert ISO_UTC.match(request[field]), request[field]
    deadline = dt.datetime.fromisoformat(request["deadline_at"])
    assert dt.timedelta(hours=23) < deadline - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=24)
    lines = demo.output.splitlines()
    assert any("demo-carol-key" in line and "Approvals" in line for line in lines)
    command = f'harness approve {request["request_id"]} --as carol --reason "parcel lost" --db {demo.db}'
    assert any(line.strip().endswith(command) for line in lines), demo.output

    text = demo.cli("approvals").stdout
    assert "approvers: support_lead" in text and "needed by" in text
    assert "(in 23 h" in text or "(in 1 d)" in text, text  # a deadline a day ahead, as people say it

    approved = demo.cli("approve", request["request_id"], "--as", "carol", "--reason", "parcel lost")
    assert approved.exit_code == 0, approved.output
    assert "SUCCEEDED" in approved.stdout
    assert _pending(demo) == []

    tree = demo.cli("trace", request["run_id"]).stdout
    numbers = [int(n) for n in re.findall(r"^[├└]── (\d) ", tree, flags=re.M)]
    assert numbers == sorted(numbers) and {6, 7} <= set(numbers), tree
    assert re.search(r"^[├└]── 6 Human approval", tree, flags=re.M) and re.search(r"^[├└]── 7 Tools", tree, flags=re.M)
    total = int(re.search(r"· (\d+) hash-chained records", tree).group(1))  # type: ignore[union-attr]
    groups = [int(n) for n in re.findall(r"^[├└]── .*  (\d+) records?$", tree, flags=re.M)]
    assert sum(groups) == total, tree
    assert "1 approval needed by" in tree and "approve L3 by default/carol" in tree
    assert not re.search(r"\b1[78]\d{8}\b", tree), "an epoch time on screen"


def test_the_demos_refund_cites_the_handbook_and_its_trace_names_the_chunk(demo: Demo) -> None:
    """The demo adds the example's policy handbook to the `handbook` knowledge base; the self-confirmed
    refund's answer cites its snippet, and the Run's trace names the chunk it was given."""
    lines = demo.output.splitlines()
    answer = next(i for i, line in enumerate(lines) if "answer: Refund" in line)
    assert "Policy [refund-policy.md § Refund policy > Refunds up to 100 EUR]:" in lines[answer], demo.output
    run_id = next(line.split()[1] for line in reversed(lines[:answer]) if line.startswith("run "))
    records = json.loads(demo.cli("trace", run_id, "--json").stdout)["records"]
    given = next(r for r in records if r["kind"] == "context")["knowledge"]
    assert any(c["source"].startswith("refund-policy.md § ") and len(c["content_hash"]) == 64 for c in given)
    listed = json.loads(demo.cli("kb", "list", "--kb", "handbook", "--json").stdout)["documents"]
    assert sorted(d["title"] for d in listed) == ["refund-policy.md", "shipping.md"]


def test_output_into_a_pipe_is_not_wrapped(demo: Demo) -> None:
    """`runs show` into a pipe keeps whole timestamps and reasons; no line is cut at 80 columns."""
    run_id = re.search(r"run (\S+)  CLOSED_REJECTED", demo.output).group(1)  # type: ignore[union-attr]
    shown = demo.cli("runs", "show", run_id).stdout
    assert "…" not in shown
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", shown)
    assert any("guardrail.refund_cap" in line and "finance team" in line for line in demo.output.splitlines())


def test_example_data_goes_to_the_data_directory_not_the_working_folder(demo: Demo) -> None:
    """The example's ledger is in the database's own folder of the data directory; the working folder gets
    nothing but what was asked."""
    ledgers = list(demo.data_dir.glob("*/support-ledger.jsonl"))
    assert len(ledgers) == 1 and '"kind": "refund"' in ledgers[0].read_text()
    assert list(demo.cwd.iterdir()) == []


def test_the_default_data_directory_is_the_users_data_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without HARNESS_DATA_DIR the data directory is harness in $XDG_DATA_HOME (else ~/.local/share)."""
    from harness.settings import Settings

    monkeypatch.delenv("HARNESS_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert Settings.from_env().data_dir == tmp_path / "xdg" / "harness"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings.from_env().data_dir == tmp_path / "home" / ".local" / "share" / "harness"
    assert "/harness-data/" not in (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()


def test_verify_with_a_checkpoint_folder_not_created_yet(demo: Demo, tmp_path: Path) -> None:
    """HARNESS_CHECKPOINT_DIR naming a folder that does not exist yet means no checkpoints yet: a warning,
    exit 0 (exit 1 with --require-checkpoint), never bad input."""
    missing = str(tmp_path / "not-yet")
    result = demo.cli("audit", "verify", HARNESS_CHECKPOINT_DIR=missing)
    assert result.exit_code == 0, result.output
    assert "no checkpoints yet" in result.stdout
    assert demo.cli("audit", "verify", "--require-checkpoint", HARNESS_CHECKPOINT_DIR=missing).exit_code == 1
    assert not Path(missing).exists()


def _commands(command: Command, path: str = "harness") -> Iterator[tuple[str, Command]]:
    """The command and every subcommand under it (the lazy `harness` group builds each one as it is read)."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, f"{path} {name}")


def test_help_texts_cite_no_spec_ids() -> None:
    """No command's or option's help names a requirement id (K8, SPEC D2, …): users have no SPEC."""
    found = []
    for path, command in _commands(typer.main.get_command(app)):
        texts = [command.help or "", command.short_help or ""]
        texts += [getattr(p, "help", None) or "" for p in command.params]
        found += [f"{path}: {t}" for t in texts if SPEC_ID.search(t)]
    assert found == []


def test_every_command_is_walked() -> None:
    """The walk above reaches every command, nested ones too, with their help and options (not vacuous)."""
    commands = dict(_commands(typer.main.get_command(app)))
    assert len(commands) > 35
    assert {"harness approve", "harness runs show", "harness audit rotate-key", "harness kb search"} <= commands.keys()
    assert commands["harness audit rotate-key"].help
    assert "new_key" in {p.name for p in commands["harness audit rotate-key"].params}
    assert all(SPEC_ID.search(t) for t in ("K8", "SPEC D2", "(S1-S3)", "seed 000"))
    assert not SPEC_ID.search("The S3-compatible server to use instead of AWS")


def test_the_demo_shows_a_chat_turn_and_a_run_that_plans_in_two_rounds(demo: Demo) -> None:
    """The chat turn succeeds with no tools; the two-round Run plans again after its lookup and answers
    from what it found."""
    sections = demo.output.split("\n== ")
    chat = next(s for s in sections if s.startswith("a chat turn"))
    assert "SUCCEEDED" in chat and "EXECUTING → PLANNING" not in chat
    rounds = next(s for s in sections if s.startswith("two rounds"))
    assert "SUCCEEDED" in rounds and "EXECUTING → PLANNING → POLICY_CHECK" in rounds, rounds
    assert "not delivered" in rounds
