"""The detectors of the maintained `detect-secrets` library, called directly on strings (never its
verification step, which would call vendors' APIs): the first of the secret filter's three layers
(harness.context.secrets), in a module of its own so that the library loads on the first scrub only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
    HighEntropyStringsPlugin,
)
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import (
    CONFIG_DENYLIST_REGEX_TO_GROUP,
    DENYLIST,
    QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
    KeywordDetector,
)
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

Span = tuple[int, int, str]
#: words that say a hex string is a content address, not a credential
_DIGEST_CONTEXT = re.compile(r"\b(?:commit|commits|sha|sha1|sha-1|sha256|sha-256|sha512|digest|hash|checksum|"
                             r"revision|rev|merged?|cherry-pick(?:ed)?|tree|blob|git|fingerprint|etag|md5)\b"
                             r"[^\n]{0,40}$", re.IGNORECASE)


def _occurrences(text: str, value: str) -> Iterable[tuple[int, int]]:
    start = text.find(value)
    while value and start >= 0:
        yield start, start + len(value)
        start = text.find(value, start + 1)


_LIBRARY_PLUGINS: tuple[tuple[type[RegexBasedDetector], str], ...] = (
    (AWSKeyDetector, "aws_key"), (ArtifactoryDetector, "artifactory_token"),
    (AzureStorageKeyDetector, "azure_storage_key"), (BasicAuthDetector, "basic_auth"),
    (DiscordBotTokenDetector, "discord_token"), (GitHubTokenDetector, "github_token"),
    (GitLabTokenDetector, "gitlab_token"), (JwtTokenDetector, "jwt"), (MailchimpDetector, "mailchimp_key"),
    (NpmDetector, "npm_token"), (OpenAIDetector, "openai_key"), (PrivateKeyDetector, "private_key"),
    (PypiTokenDetector, "pypi_token"), (SendGridDetector, "sendgrid_key"), (SlackDetector, "slack_token"),
    (SquareOAuthDetector, "square_oauth"), (StripeDetector, "stripe_key"),
    (TelegramBotTokenDetector, "telegram_token"), (TwilioKeyDetector, "twilio_key"),
)


class DetectSecretsDetector:
    """The detect-secrets plugins, line by line, with unquoted high-entropy search for long tokens."""

    name = "detect-secrets"
    #: shortest unquoted token the entropy check looks at; shorter ones are words, ids and codes
    MIN_B64, MIN_HEX = 20, 32

    def __init__(self) -> None:
        self._plugins = [(cls(), kind) for cls, kind in _LIBRARY_PLUGINS]
        self._keyword = KeywordDetector()
        self._b64 = Base64HighEntropyString(limit=4.5)
        self._hex = HexHighEntropyString(limit=3.0)
        # the keyword detector's regexes are the slow part: only run them where a keyword occurs
        self._keyword_hint = re.compile("|".join(DENYLIST), re.IGNORECASE)
        self._b64_run = re.compile(rf"[A-Za-z0-9+/_\-]{{{self.MIN_B64},}}={{0,2}}")
        self._hex_run = re.compile(rf"[0-9a-fA-F]{{{self.MIN_HEX},}}")

    def find(self, text: str) -> Iterable[Span]:
        """Spans found by any plugin, line by line as the library expects."""
        offset = 0
        for line in text.splitlines(keepends=True):
            for start, end, kind in self._find_in_line(line.rstrip("\r\n")):
                yield offset + start, offset + end, kind
            offset += len(line)

    def _find_in_line(self, line: str) -> Iterable[Span]:
        for plugin, kind in self._plugins:
            for value in plugin.analyze_string(line):
                for start, end in _occurrences(line, value):
                    yield start, end, kind
        for table in (QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP, CONFIG_DENYLIST_REGEX_TO_GROUP):
            if not self._keyword_hint.search(line):
                break
            for value in self._keyword.analyze_string(line, denylist_regex_to_group=table):
                for start, end in _occurrences(line, value):
                    yield start, end, "secret_keyword"
        entropy_checks: tuple[tuple[re.Pattern[str], HighEntropyStringsPlugin, str], ...] = (
            (self._b64_run, self._b64, "high_entropy"), (self._hex_run, self._hex, "high_entropy_hex"))
        for regex, entropy, kind in entropy_checks:
            for match in regex.finditer(line):
                if kind == "high_entropy_hex" and _DIGEST_CONTEXT.search(line, max(0, match.start() - 48),
                                                                         match.start()):
                    continue  # a commit id or a digest named as one ("commit 3f2a…", "sha256: e3b0…")
                if kind == "high_entropy" and _is_path(match.group()):
                    yield from self._random_segments(match, entropy, kind)
                elif entropy.calculate_shannon_entropy(match.group()) > entropy.entropy_limit:
                    yield match.start(), match.end(), kind

    def _random_segments(self, match: re.Match[str], entropy: HighEntropyStringsPlugin, kind: str) -> Iterable[Span]:
        """A path's segments judged one by one: `/tmp/runs/01a2…` is not a secret for the mix of its
        names, but a long random segment in it (`/keys/<token>`) still is."""
        start = match.start()
        for segment in match.group().split("/"):
            if len(segment) >= self.MIN_B64 and entropy.calculate_shannon_entropy(segment) > entropy.entropy_limit:
                yield start, start + len(segment), kind
            start += len(segment) + 1


def _is_path(token: str) -> bool:
    """Whether an unquoted token reads as a file path: absolute, with at least two named folders (random
    base64 starts with a slash once in 64 and has one about every 64 characters)."""
    return token.startswith("/") and token.count("/") >= 3 and "//" not in token
