"""Token counting with real, bundled encodings (SPEC C1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.context.tokenizer import (
    ANTHROPIC_MARGIN,
    ENCODINGS,
    ApproxTokenizer,
    BpeTokenizer,
    ScaledTokenizer,
    openai_encoding,
    tokenizer_for,
)
from harness.domain.errors import InvalidRequestError


def test_cl100k_counts_known_strings_exactly() -> None:
    """The precheck counts what the model counts: published cl100k counts, not a length heuristic."""
    tok = BpeTokenizer("cl100k_base")
    assert tok.count("hello world") == 2
    assert tok.count("") == 0
    assert tok.count("tiktoken is great!") == 6
    assert ApproxTokenizer().count("tiktoken is great!") != 6


def test_encodings_differ_where_the_provider_differs() -> None:
    """o200k and cl100k give different counts on the same text, so the provider's own encoding is used."""
    text = "Привет, как дела? 東京の天気は晴れです。 " * 20
    assert BpeTokenizer("o200k_base").count(text) != BpeTokenizer("cl100k_base").count(text)


@pytest.mark.parametrize(("provider", "model", "expected"), [
    ("openai", "gpt-4o-mini", "o200k_base"), ("openai", "gpt-4.1", "o200k_base"),
    ("openai", "gpt-4-0613", "cl100k_base"), ("openai", "gpt-3.5-turbo", "cl100k_base"),
    ("openai", "some-local-model", "o200k_base"), ("scripted", None, "cl100k_base"),
])
def test_the_provider_and_model_choose_the_encoding(provider: str, model: str | None, expected: str) -> None:
    """Each OpenAI model family is counted with its own encoding; the scripted default uses cl100k."""
    assert tokenizer_for(provider, model).name == expected
    if provider == "openai":
        assert openai_encoding(model) == expected


def test_anthropic_is_counted_with_a_margin_on_the_safe_side() -> None:
    """Anthropic's tokenizer is not public: the estimate never counts fewer tokens than cl100k does."""
    tok = tokenizer_for("anthropic")
    assert isinstance(tok, ScaledTokenizer)
    text = "Where is my order A-1001? It was due last week. " * 10
    assert tok.count(text) >= BpeTokenizer("cl100k_base").count(text) * ANTHROPIC_MARGIN


def test_an_explicit_encoding_wins_and_an_unknown_one_is_refused() -> None:
    """An operator can pin the encoding; a misspelt one is a configuration error, not a silent fallback."""
    assert tokenizer_for("openai", "gpt-4o", "cl100k_base").name == "cl100k_base"
    assert tokenizer_for("scripted", None, "approx").name == "approx"
    with pytest.raises(InvalidRequestError, match="unknown token encoding"):
        BpeTokenizer("p99k_base")


def test_the_known_encodings_are_those_the_package_ships() -> None:
    """BpeTokenizer checks a name against ENCODINGS without loading the vocabularies; the list must be
    exactly what bpe-openai provides."""
    from bpe_openai import _bindings

    assert sorted(ENCODINGS) == sorted(_bindings.supported_encodings())


def test_the_vocabulary_loads_on_the_first_count_only() -> None:
    """Building a tokenizer (every runtime does) costs nothing; the first count loads the encoding, with
    tiktoken, and never bpe-openai's bindings (~68 MB) for an encoding tiktoken defines."""
    code = ("import sys; from harness.context.tokenizer import BpeTokenizer; t = BpeTokenizer('cl100k_base'); "
            "print('tiktoken' in sys.modules); print(t.count('hello world')); print('tiktoken' in sys.modules); "
            "print('bpe_openai' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "2", "True", "False"]


#: text where encoders disagree when they are not the same: scripts, digits, code, runs of whitespace,
#: contractions, emoji, and special-token text (counted as plain text)
CORPUS = [
    "hello world", "tiktoken is great!", "I'd've thought they'll say it's 'fine' -- WE'RE DONE.",
    "Привет, как дела? 東京の天気は晴れです。 مرحبا بالعالم 🤖🚀 naïve café",
    "def f(x):\n    return x ** 2  # square\n\n\n\tif x > 10_000: pass\r\n",
    "order A-1001 shipped 2026-12-04T10:15:00Z for $1,234.56 (12345678901234567890)",
    "<|endoftext|> <|fim_prefix|> text after special-token markers", "   leading and trailing   \n\n  ",
    "https://example.com/path?q=1&r=two#frag" * 3, "".join(chr(c) for c in range(0x20, 0x250)),
]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_tiktoken_counts_as_the_bundled_encoder_does(encoding: str) -> None:
    """The counts come from tiktoken now; on every kind of text they are those of bpe-openai's own encoder,
    which counted them before."""
    from bpe_openai import _bindings

    reference = _bindings.tokenizer_for_encoding(encoding)
    tok = BpeTokenizer(encoding)
    for text in [*CORPUS, " ".join(CORPUS) * 40]:
        assert tok.count(text) == reference.count(text), text[:60]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_the_patterns_are_tiktokens_own(encoding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split patterns written here are those tiktoken defines for the encoding (its definition is read
    without the download it would start)."""
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    from harness.context.tokenizer import _TIKTOKEN

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *_a, **_k: {})
    assert getattr(openai_public, encoding)()["pat_str"] == _TIKTOKEN[encoding][0]


def test_a_vocabulary_that_is_not_openais_is_refused() -> None:
    """The vocabulary file is checked against the hash tiktoken publishes: a file that differs is named."""
    from harness.context.tokenizer import _ranks

    with pytest.raises(InvalidRequestError, match=r"cl100k_base vocabulary at .*cl100k_base\.tiktoken\.gz is not"):
        _ranks("cl100k_base", "0" * 64)
def test_remembered_counts_are_the_encodings_own() -> None:
    """Counts of texts seen before (a system prompt, tool schemas: at every Run) are looked up, per
    encoding: the same numbers as counting afresh, for texts below and above the remembered length."""
    from harness.context.tokenizer import _REMEMBERED_CHARS, _load

    texts = ["hello world", "Привет, как дела? 東京の天気は晴れです。 " * 40, "x y " * (_REMEMBERED_CHARS // 4 + 10)]
    for encoding in ("cl100k_base", "o200k_base"):
        tok = BpeTokenizer(encoding)
        for text in texts:
            fresh = int(_load(encoding).count(text))
            assert tok.count(text) == fresh
            assert tok.count(text) == fresh  # the second time from memory
    assert BpeTokenizer("o200k_base").count(texts[1]) != BpeTokenizer("cl100k_base").count(texts[1])
