"""Canonical JSON, which every content hash is taken over, is exactly what the standard library's encoder
writes with sorted keys, no spaces, UTF-8 as is and no NaN: orjson writes it where its text is the same
(most values), and every hash taken by an earlier version keeps its value."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import hashlib
import json
import math
import uuid
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.domain.chain import canonical_json, content_hash

_REFERENCE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_text = st.text(st.characters(blacklist_categories=_SURROGATES), max_size=12)
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e-4, 9.99e-5, 1e-5, 1e-7, 5e-324, 1e15, 1e16, 1e22, 123456789012345680.0, 1.7976931348623157e308])
_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**64, max_value=2**64) | _floats
            | _text)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                       | st.dictionaries(_text, inner, max_size=4), max_leaves=20)


def _reference(value: Any) -> str | type[BaseException]:
    try:
        return _REFERENCE.encode(value)
    except (TypeError, ValueError) as exc:
        return type(exc)


def _ours(value: Any) -> str | type[BaseException]:
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        return type(exc)


@settings(max_examples=2_000)
@given(_values)
def test_canonical_json_is_the_standard_librarys_text(value: Any) -> None:
    assert _ours(value) == _reference(value)
    if isinstance(_reference(value), str):
        assert content_hash(value) == hashlib.sha256(_REFERENCE.encode(value).encode()).hexdigest()


@pytest.mark.parametrize("value", [
    1e-5, [1e-7], {"usd": 4.722452435761166e-07}, {"small": 2.1e-05, "note": None}, 1e16, 1e22, -0.0,
    {"b": 1, "a": {"d": [None, 1.0], "c": "x"}}, {"é": 1, "e": 2, "😀": 3, "\uffff": 4}, "\x00\x1f\x7f\u2028\"\\",
    2**63, 2**64, -2**63 - 1, (1, [2, (3,)]), {"t": (None, 0.5)}, True, None, [],
])
def test_values_orjson_writes_otherwise_or_refuses_are_the_standard_librarys(value: Any) -> None:
    """Small floats (1e-05 against orjson's 0.00001), ints beyond 64 bits, tuples beside nulls."""
    assert _ours(value) == _reference(value)


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.StrEnum):
    HIGH = "high"


class _Count(enum.IntEnum):
    TWO = 2


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize("value", [
    collections.OrderedDict(b=1, a=2), {1: "a", 2: "b"}, {_Level.HIGH: 1}, _Level.HIGH, {"k": _Level.HIGH}, _Count.TWO,
    datetime.date(2026, 12, 3), _Point(1), {1, 2}, b"bytes", "\ud800", {"x": "\udfff"},
])
def test_subclasses_and_types_orjson_treats_otherwise_are_the_standard_librarys(value: Any) -> None:
    """Dict and str subclasses, keys that are not str, dates, dataclasses, sets, bytes and lone surrogates
    are encoded, or refused, exactly as the standard library does."""
    assert _ours(value) == _reference(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [None, math.nan], {"a": None, "b": [1, math.inf]},
                                   {"t": (None, math.nan)}])
def test_nan_and_infinity_are_refused_as_ever(value: Any) -> None:
    """orjson writes them as null; canonical JSON refuses them (a null would hash like None)."""
    with pytest.raises(ValueError, match="Out of range float values"):
        canonical_json(value)
    with pytest.raises(ValueError):
        content_hash(value)


def test_a_uuid_and_an_enum_member_which_the_standard_library_refuses_are_written_as_their_values() -> None:
    """Nothing hashed before had one (the encoder refused it); now a UUID is its string and a member its
    value, with or without a null beside it."""
    key = uuid.UUID("0190c0de-0000-7000-8000-000000000001")
    assert canonical_json({"id": key, "c": _Colour.RED}) == '{"c":"red","id":"0190c0de-0000-7000-8000-000000000001"}'
    assert canonical_json({"id": key, "none": None}) == '{"id":"0190c0de-0000-7000-8000-000000000001","none":null}'


def test_a_known_content_hash_never_changes() -> None:
    """A fixed vector: hashes recorded by earlier versions must stay what they were."""
    value = {"order_id": "A-1001", "amount": 12.5, "tiny": 1e-05, "tags": ["a", "é"], "none": None}
    assert canonical_json(value) == '{"amount":12.5,"none":null,"order_id":"A-1001","tags":["a","é"],"tiny":1e-05}'
    assert content_hash(value) == hashlib.sha256(canonical_json(value).encode()).hexdigest()
