"""The support example's side effects are kept per database: two databases sharing one data directory
(two checkouts on one account) never write to, or read, each other's ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import Harness


def test_two_databases_keep_two_ledgers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A note written by a Run on one database lands in that database's folder of the data directory."""
    monkeypatch.delenv("HARNESS_EXAMPLE_LEDGER", raising=False)
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HARNESS_MEMORY", "off")
    ledgers: dict[str, Path] = {}
    for name in ("first", "second"):
        with Harness(db=str(tmp_path / f"{name}.db")) as h:
            result = h.run(f"Where is order A-1001? ({name})", user="alice")
            assert result.state == "SUCCEEDED", result
            ledgers[name] = tmp_path / "data" / h.runtime.store.database_id() / "support-ledger.jsonl"
            notes = [json.loads(line) for line in ledgers[name].read_text().splitlines()]
            assert [n["run_id"] for n in notes] == [result.run_id]
    assert ledgers["first"].parent != ledgers["second"].parent
    assert not (tmp_path / "data" / "support-ledger.jsonl").exists()
