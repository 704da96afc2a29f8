"""A trace record's canonical bytes (SPEC A3) are exactly the compact JSON array of its fields."""

from __future__ import annotations

import json
from typing import Literal

from hypothesis import given
from hypothesis import strategies as st

from harness.domain.chain import record_bytes, record_hash

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _reference(seq: int, record_id: str, run_id: str | None, kind: str, prev_hash: str, payload: str) -> bytes:
    return _ENCODER.encode([seq, record_id, run_id or "", kind, prev_hash, payload]).encode("utf-8")


_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_text = st.text(st.characters(blacklist_categories=_SURROGATES))  # any text UTF-8 can carry


@given(seq=st.integers(min_value=1, max_value=2**63 - 1), record_id=_text, run_id=st.none() | _text, kind=_text,
       prev_hash=_text, payload=_text)
def test_record_bytes_are_the_compact_json_array_of_the_fields(seq: int, record_id: str, run_id: str | None,
                                                               kind: str, prev_hash: str, payload: str) -> None:
    assert record_bytes(seq, record_id, run_id, kind, prev_hash, payload) == _reference(
        seq, record_id, run_id, kind, prev_hash, payload)


def test_quotes_backslashes_control_characters_and_non_ascii_are_written_as_json_writes_them() -> None:
    payload = '{"note":"a \\"quoted\\" line\\nand a tab\\t, é, 漢字, \\u2028, emoji 🙂"}\x00\x1f\x7f'
    data = record_bytes(7, "r-1", None, "step", "0" * 64, payload)
    assert data == _reference(7, "r-1", None, "step", "0" * 64, payload)
    assert json.loads(data) == [7, "r-1", "", "step", "0" * 64, payload]


def test_the_hash_of_a_known_record_never_changes() -> None:
    """A fixed vector: chains written by earlier versions must keep verifying."""
    assert record_hash(1, "00000000-0000-7000-8000-000000000001", "run-1", "transition", "0" * 64,
                       '{"from":null,"to":"CREATED"}') == _known_vector()


def _known_vector() -> str:
    import hashlib

    return hashlib.sha256(
        b'[1,"00000000-0000-7000-8000-000000000001","run-1","transition",'
        b'"0000000000000000000000000000000000000000000000000000000000000000","{\\"from\\":null,\\"to\\":\\"CREATED\\"}"]'
    ).hexdigest()
