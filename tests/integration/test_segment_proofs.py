"""An archived Run proven with `harness-verify` alone (a segment and a checkpoint, no database), and a
segment edited, truncated, reordered or cut short caught."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.chain import record_hash
from harness.drive.state_machine import StateMachine
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.storage import LocalSegmentStore
from harness.wiring.retention import archive_rows
from tests.integration.bulk_runs import clone, drive

Lines = list[dict[str, Any]]


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """(segment file, its checkpoint file, the archived Run ids) of a database that is then deleted."""
    tmp = tmp_path_factory.mktemp("segment")
    clock = FakeClock()
    store = SqlStore.open(str(tmp / "gone.db"), clock)
    machine = StateMachine(store)
    first = drive(machine)
    ids = [first, *clone(store, first, 11)]
    clock.advance(10 * DAY_S)
    report = Archiver(archive_rows(store), LocalSegmentStore(tmp / "archive"), tmp / "checkpoints",
                      policy=RetentionPolicy(days=1)).run()
    store.close()
    (tmp / "gone.db").unlink()
    assert report.runs == 12 and report.location and report.checkpoint
    return tmp / "archive" / Path(report.location).name, tmp / "checkpoints" / report.checkpoint, ids


def verify(segment: Path, checkpoint: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`harness-verify segment …` as an auditor runs it, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "harness.audit.standalone", "segment", str(segment),
                           "--checkpoint", str(checkpoint), "--json", *extra],
                          capture_output=True, text=True, timeout=60, check=False)


def rewritten(segment: Path, tmp: Path, change: Callable[[Lines], Lines]) -> Path:
    """A copy of the segment with its lines changed."""
    lines = [json.loads(x) for x in gzip.decompress(segment.read_bytes()).decode().splitlines()]
    out = tmp / "changed.jsonl.gz"
    out.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in change(lines)).encode()))
    return out


def test_an_archived_run_is_proven_without_any_database(archived: tuple[Path, Path, list[str]]) -> None:
    """The segment and the checkpoint (with the public key published beside it) prove a named Run."""
    segment, checkpoint, ids = archived
    done = verify(segment, checkpoint, "--run", ids[7])
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] and doc["checked"] == 12
    assert any(ids[7] in note for note in doc["notes"])
    assert verify(segment, checkpoint, "--run", "no-such-run").returncode == 1


def _edit_payload(lines: Lines) -> Lines:
    lines[3]["records"][0]["payload"] += " "
    return lines


def _edit_with_hash(lines: Lines) -> Lines:
    rec = lines[3]["records"][0]
    rec["payload"] += " "
    rec["hash"] = record_hash(rec["seq"], rec["record_id"], rec["run_id"], rec["kind"], rec["prev_hash"],
                              rec["payload"])
    return lines


def _swap(lines: Lines) -> Lines:
    lines[2], lines[3] = lines[3], lines[2]
    lines[2]["index"], lines[3]["index"] = 1, 2  # even renumbered, the digest gives the order away
    return lines


def _drop_run(lines: Lines) -> Lines:
    del lines[5]
    for i, line in enumerate(lines[1:-1]):
        line["index"] = i
    return lines


def _drop_record(lines: Lines) -> Lines:
    del lines[4]["records"][2]
    return lines


@pytest.mark.parametrize(("change", "named"), [
    (_edit_payload, "edited"), (_edit_with_hash, "signed root"), (_swap, "reordered"),
    (_drop_run, "truncated, or Runs removed"), (_drop_record, "withheld"), (lambda lines: lines[:-1], "trailer"),
])
def test_a_changed_segment_is_caught(archived: tuple[Path, Path, list[str]], tmp_path: Path,
                                     change: Callable[[Lines], Lines], named: str) -> None:
    """An edit (with or without its hash recomputed), a reordering, a Run or record removed, or a cut
    trailer each fail the check, exit 1, naming what happened."""
    segment, checkpoint, _ = archived
    done = verify(rewritten(segment, tmp_path, change), checkpoint)
    assert done.returncode == 1, done.stdout
    assert named in " ".join(json.loads(done.stdout)["failures"])


def test_a_truncated_file_is_caught(archived: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    """A segment file cut short (a partial copy or upload) is refused as such, without a traceback."""
    segment, checkpoint, _ = archived
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(segment.read_bytes()[: segment.stat().st_size // 2])
    done = verify(cut, checkpoint)
    assert done.returncode == 1 and "truncated" in done.stdout and "Traceback" not in done.stderr
    cut.write_bytes(b"not a segment")
    done = verify(cut, checkpoint)
    assert done.returncode == 2 and "not a gzip" in done.stderr and "Traceback" not in done.stderr


def test_a_segment_under_another_key_is_refused(archived: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    """Trusting another public key, the same segment does not verify."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    segment, _, _ = archived
    other = tmp_path / "other.pem"
    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    done = subprocess.run([sys.executable, "-m", "harness.audit.standalone", "segment", str(segment),
                           "--public-key", str(other)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "not a trusted key" in done.stdout
