"""Secret and short-lived PII filtering for everything that goes to a model (SPEC C4).

Three layers find secrets: the detectors of the maintained `detect-secrets` library, called directly on
strings (never its verification step, which would call vendors' APIs); this project's patterns for
what that library does not cover as text in a conversation: bearer and Authorization headers, cookies,
OAuth tokens and codes, temporary cloud credentials, key formats it lacks (lower-case AWS ids, Google,
Hugging Face, Stripe test keys), one-time codes, whole private-key blocks and complete JWTs; and
credentials stated in prose, in several languages (harness.context.prose_secrets). Every detector reads
the text normalised — NFKC, invisible characters (zero-width spaces, joiners, soft hyphens, …) removed —
so "ghp_" with a zero-width space inside or "password" in full-width letters is still found; the finding
is redacted in the original text.

A finding is widened to the whole token it sits in (detect-secrets reports a JWT without its signature,
for instance) and replaced with ``[REDACTED:<kind>]``. The output is scanned again; a filter that
raises, or whose output still holds a finding, refuses (SecretFilterError): the Run must not go on.
"""

from __future__ import annotations

import bisect
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.context.errors import SecretFilterError
from harness.context.prose_secrets import ProseDetector, normalise

Span = tuple[int, int, str]
PLACEHOLDER = re.compile(r"\[REDACTED:[a-z0-9_]+\]")
#: characters a token is made of; a finding is widened over them to its whole token ("=" only to the
#: right, as base64 padding, so that `name=value` keeps its name)
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "+/_-.~%")
#: kinds that only say "looks random"; a more specific kind wins when spans overlap
_GENERIC = ("high_entropy", "high_entropy_hex", "secret_keyword")


class Detector(Protocol):
    """Finds secrets in a text: (start, end, kind) spans."""

    name: str

    def find(self, text: str) -> Iterable[Span]:
        """Every span of `text` that holds a secret."""
        ...


@dataclass(frozen=True)
class Scrubbed:
    """A text with its secrets replaced, and the kinds of what was removed."""

    text: str
    kinds: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        """How many secrets were removed."""
        return len(self.kinds)


_I = re.IGNORECASE
_ASSIGN = r"""["']?\s*(?:[:=]|=>)\s*["']?"""
#: (pattern, kind, group to redact); group 0 means the whole match
PROJECT_PATTERNS: tuple[tuple[re.Pattern[str], str, int], ...] = (
    (re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"), "private_key", 0),
    (re.compile(r"\b(?:proxy-)?authorization\s*[:=]\s*[\"']?((?:[A-Za-z]+\s+)?[^\s\"',;]+)", _I),
     "authorization_header", 1),
    (re.compile(r"\bbearer\s+([A-Za-z0-9\-._~+/]{8,}=*)", _I), "bearer_token", 1),
    (re.compile(r"\b(?:set-cookie|cookie)\s*:\s*([^\r\n]+)", _I), "cookie", 1),
    (re.compile(r"\b(?:session_?id|sess_?id|sid|phpsessid|jsessionid|connect\.sid|_session|csrftoken|"
                r"xsrf-token|remember_token|auth_cookie)\s*[=:]\s*[\"']?([^\s;,&\"']{6,})", _I), "cookie", 1),
    (re.compile(r"\b(?:access_token|refresh_token|id_token|oauth_token|oauth_verifier|client_secret|"
                r"api[_-]?key|apikey|auth[_-]?token|session[_-]?token|x-api-key|x-auth-token|"
                r"private[_-]?token|secret[_-]?key|secretaccesskey|sessiontoken|aws_session_token|"
                r"aws_security_token|aws_secret_access_key)\b" + _ASSIGN + r"([^\s\"'&,;}]{6,})", _I),
     "oauth_or_api_token", 1),
    (re.compile(r"[?&#](?:access_token|id_token|refresh_token|token|code|client_secret|sig|signature|"
                r"x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
                r"x-goog-credential)=([^&\s#\"']+)", _I), "url_credential", 1),
    # the password of any URL with credentials (detect-secrets misses an empty user, "+srv", "!")
    (re.compile(r"\b[a-z][a-z0-9+.\-]{1,20}://[^\s:/@]*:([^\s/@]{1,200})@", _I), "url_password", 1),
    (re.compile(r"\bya29\.[0-9A-Za-z\-_]+"), "oauth_token", 0),
    (re.compile(r"\b1//0[0-9A-Za-z\-_]{20,}"), "oauth_token", 0),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})\b"), "github_token", 0),
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[0-9A-Z]{16}\b"), "aws_key", 0),
    # the same ids written in lower or mixed case (then with a digit, as real ones have)
    (re.compile(r"\b(?i:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|ABIA|ACCA)(?=[0-9A-Za-z]{0,15}\d)[0-9A-Za-z]{16}\b"),
     "aws_key", 0),
    (re.compile(r"\bAIza[0-9A-Za-z\-_]{35}(?![0-9A-Za-z\-_])"), "google_api_key", 0),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "huggingface_token", 0),
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}\b"), "stripe_key", 0),
    (re.compile(r"\bxox[abposr]-[0-9A-Za-z-]{10,}"), "slack_token", 0),
    (re.compile(r"\bsk-(?:ant-|proj-|live-)?[A-Za-z0-9_\-]{20,}"), "api_key", 0),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"), "jwt", 0),
    (re.compile(r"\b(?:otp|one[- ]time (?:password|code|passcode)|verification code|security code|"
                r"(?:2fa|mfa|sms|login|auth(?:entication)?) code)\b[^0-9\n]{0,24}(\d{4,8})\b", _I),
     "one_time_code", 1),
)


class PatternDetector:
    """This project's patterns (see PROJECT_PATTERNS)."""

    name = "project-patterns"

    def __init__(self, patterns: Sequence[tuple[re.Pattern[str], str, int]] = PROJECT_PATTERNS) -> None:
        self.patterns = patterns

    def find(self, text: str) -> Iterable[Span]:
        """Spans of every pattern's redaction group."""
        for pattern, kind, group in self.patterns:
            for match in pattern.finditer(text):
                if match.group(group):
                    yield match.start(group), match.end(group), kind


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and text[start - 1] in _TOKEN_CHARS:
        start -= 1
    while end < len(text) and (text[end] in _TOKEN_CHARS or text[end] == "="):
        end += 1
    return start, end


def _merge(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end, kind in sorted(spans):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            better = kind if last[2] in _GENERIC and kind not in _GENERIC else last[2]
            merged[-1] = (last[0], max(last[1], end), better)
        else:
            merged.append((start, end, kind))
    return merged


class SecretFilter:
    """Removes secrets from text before it can reach a model; refuses when it cannot be sure."""

    ROUNDS = 3
    #: a conversation's history is scrubbed again on every turn: remember recent answers
    CACHE_SIZE = 4096

    def __init__(self, detectors: Sequence[Detector] | None = None) -> None:
        self._detectors = detectors
        self._cache: OrderedDict[str, Scrubbed] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def detectors(self) -> Sequence[Detector]:
        """The detectors given, or the three layers, made on the first scrub: the library's plugins cost
        a process ~6 MB and a quarter of a second to import, which commands that filter nothing skip."""
        if self._detectors is None:
            with self._lock:
                if self._detectors is None:
                    from harness.context.library_secrets import DetectSecretsDetector

                    self._detectors = (DetectSecretsDetector(), PatternDetector(), ProseDetector())
        return self._detectors

    def scrub(self, text: str) -> Scrubbed:
        """`text` with every secret replaced; SecretFilterError if a detector fails or one survives."""
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                return cached
        result = self._scrub(text)
        with self._lock:
            self._cache[text] = result
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    def scrub_json(self, value: Any) -> tuple[Any, tuple[str, ...]]:
        """A JSON value (a tool's output) with its secrets replaced, and the kinds removed. Each string is
        read after the name of the field it is in ("pin: 4821"), so a value that is a secret only by its
        field's name is found; a number or a string found to be a secret becomes its placeholder text."""
        kinds: list[str] = []
        clean = self._walk(value, None, kinds)
        return clean, tuple(kinds)

    def _walk(self, value: Any, key: str | None, kinds: list[str]) -> Any:
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for name, item in value.items():
                clean_name = self._field(None, name, kinds) if isinstance(name, str) else name
                out[clean_name] = self._walk(item, name if isinstance(name, str) else key, kinds)
            return out
        if isinstance(value, list | tuple):
            return [self._walk(item, key, kinds) for item in value]
        if isinstance(value, str):
            return self._field(key, value, kinds)
        if isinstance(value, int | float) and not isinstance(value, bool):
            text = str(value)
            clean = self._field(key, text, kinds)
            return value if clean == text else clean
        return value

    def _field(self, key: str | None, text: str, kinds: list[str]) -> str:
        """`text` filtered as the value of field `key` (its name read before it, then taken off again)."""
        if key is None:
            found = self.scrub(text)
        else:
            prefix = f"{key}: "
            found = self.scrub(prefix + text)
            if not found.count:
                return text
            if found.text.startswith(prefix):
                found = Scrubbed(found.text[len(prefix):], found.kinds)
            else:  # the field's name was taken for a secret itself: the value on its own
                found = self.scrub(text)
        kinds.extend(found.kinds)
        return found.text

    def _scrub(self, text: str) -> Scrubbed:
        kinds: list[str] = []
        for _ in range(self.ROUNDS):
            spans = self._spans(text)
            if not spans:
                return Scrubbed(text, tuple(kinds))
            pieces, cursor = [], 0
            for start, end, kind in spans:
                pieces += [text[cursor:start], f"[REDACTED:{kind}]"]
                kinds.append(kind)
                cursor = end
            text = "".join(pieces) + text[cursor:]
        raise SecretFilterError(f"secret filter: findings remain after {self.ROUNDS} rounds of redaction")

    def _spans(self, text: str) -> list[Span]:
        """Findings in `text`, as spans of `text`: the detectors read its normalised form (NFKC, invisible
        characters removed), and each finding maps back to the original characters it came from."""
        seen, starts, ends = normalise(text)
        found: list[Span] = []
        placeholders = [(m.start(), m.end()) for m in PLACEHOLDER.finditer(seen)]
        for detector in self.detectors:
            try:
                spans = list(detector.find(seen))
            except Exception as exc:  # any detector failure means the text is not known to be safe
                raise SecretFilterError(f"secret filter: detector {detector.name} failed: "
                                        f"{type(exc).__name__}: {exc}") from exc
            for first, last, kind in spans:
                start, end = _widen(seen, first, last)
                if end > start and not _inside(placeholders, start, end):
                    found.append((starts[start], ends[end - 1], kind))
        return _merge(found)


def _inside(placeholders: list[tuple[int, int]], start: int, end: int) -> bool:
    at = bisect.bisect_right(placeholders, (start, len(placeholders) and 1 << 62)) - 1
    return at >= 0 and placeholders[at][0] <= start and end <= placeholders[at][1]
