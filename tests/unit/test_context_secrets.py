"""The secret and short-lived PII filter (SPEC C4)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from harness.context.errors import SecretFilterError
from harness.context.library_secrets import DetectSecretsDetector
from harness.context.prose_secrets import ProseDetector
from harness.context.secrets import PLACEHOLDER, PatternDetector, SecretFilter, Span

#: (name, text as it might appear in a conversation, the part that must never reach a model)
CANARIES: tuple[tuple[str, str, str], ...] = (
    ("aws_access_key", "use key AKIAQ7CANARY4EXAMPLE1 for the bucket", "AKIAQ7CANARY4EXAMPLE1"),
    ("aws_secret_key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYCANARYKEY1",
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYCANARYKEY1"),
    ("aws_session_token", "export AWS_SESSION_TOKEN=FwoGZXIvYXdzEBYaDCanaryTokenValue1234567890abcd",
     "FwoGZXIvYXdzEBYaDCanaryTokenValue1234567890abcd"),
    ("github_token", "my token is ghp_CanaryGithubToken0123456789abcdefghij",
     "ghp_CanaryGithubToken0123456789abcdefghij"),
    ("github_pat", "github_pat_11CANARY0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ",
     "github_pat_11CANARY0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"),
    ("jwt", "session jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjYW5hcnktdXNlciJ9."
            "c2lnbmF0dXJlLWNhbmFyeS0xMjM0NTY3ODkw ok",
     "c2lnbmF0dXJlLWNhbmFyeS0xMjM0NTY3ODkw"),
    ("cookie", "Cookie: sessionid=canarySess10n4242; csrftoken=canaryCsrf4242", "canarySess10n4242"),
    ("set_cookie", "Set-Cookie: __Host-auth=Y2FuYXJ5Q29va2llVmFsdWU; Path=/; Secure",
     "Y2FuYXJ5Q29va2llVmFsdWU"),
    ("password_prose", "btw my password is Canary-Hunter2!", "Canary-Hunter2!"),
    ("password_field", "password: CanaryTr0ub4dor&3", "CanaryTr0ub4dor&3"),
    ("bearer", "curl -H 'Authorization: Bearer canaryBearerTok3n0123456789'", "canaryBearerTok3n0123456789"),
    ("oauth_code", "https://app.example.com/cb?code=4/CanaryAuthCode-0123456789&state=xyz",
     "4/CanaryAuthCode-0123456789"),
    ("oauth_access", '{"access_token": "ya29.CanaryGoogleAccessToken_0123456789"}',
     "ya29.CanaryGoogleAccessToken"),
    ("basic_auth_url", "postgres://admin:CanaryDbPass99@db.internal:5432/app", "CanaryDbPass99"),
    ("one_time_code", "Your verification code is 739184", "739184"),
    ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAcanaryKeyBody0123456789\n"
                    "-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEAcanaryKeyBody0123456789"),
    ("openai_key", "OPENAI_API_KEY=sk-proj-CanaryOpenAiKey0123456789abcdef",
     "CanaryOpenAiKey0123456789abcdef"),
)


@pytest.fixture(scope="module")
def secret_filter() -> SecretFilter:
    """One filter for the module (its detectors are stateless)."""
    return SecretFilter()


@pytest.mark.parametrize(("name", "text", "secret"), CANARIES, ids=[c[0] for c in CANARIES])
def test_every_canary_is_removed(secret_filter: SecretFilter, name: str, text: str, secret: str) -> None:
    """Each kind of secret or short-lived credential is replaced by a placeholder, whatever its format."""
    out = secret_filter.scrub(text)
    assert secret not in out.text, out.text
    assert "[REDACTED:" in out.text and out.count >= 1


def test_ordinary_support_text_is_left_alone(secret_filter: SecretFilter) -> None:
    """Order ids, customer ids, dates, amounts and run ids are not secrets and pass unchanged."""
    text = ("Where is order A-1001? Customer C-17 asked on 2026-11-30 about a refund of 42.50 EUR; "
            "run 3f2a9c1e-1b2c-4d5e-8f90-123456789abc. Please check the carrier (DHL) and the password "
            "policy.")
    assert secret_filter.scrub(text).text == text


def test_a_path_is_judged_by_its_segments(secret_filter: SecretFilter) -> None:
    """A working folder named after a run id is not a secret for the mix of its names (a sandboxed `pwd`),
    but a random token that is one of its segments still goes."""
    path = "/tmp/pytest-of-root/pytest-147/popen-gw1/test_shell0/runs/01a24546-1bc7-71de-9822-b7d574b6146b"
    assert secret_filter.scrub(path).text == path
    token = "q8Zr3kT0vW2nX9bL4mC7yH1sJ6dF5gA0"
    out = secret_filter.scrub(f"/var/lib/keys/{token}/current").text
    assert token not in out and "[REDACTED:high_entropy]" in out  # widened to the whole path, as any token


def test_a_key_name_survives_and_only_its_value_goes(secret_filter: SecretFilter) -> None:
    """`name=value` keeps its name, so the model still knows a credential was there."""
    out = secret_filter.scrub("refresh_token=1//0gCanaryRefreshToken0123456789").text
    assert out.startswith("refresh_token=[REDACTED:")


def test_a_jwt_loses_its_signature_too(secret_filter: SecretFilter) -> None:
    """The library matches a JWT without its signature; the filter widens to the whole token."""
    token = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
             "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
    assert secret_filter.scrub(f"token {token} end").text == "token [REDACTED:jwt] end"


def test_the_library_and_the_project_patterns_each_catch_their_own() -> None:
    """detect-secrets finds library formats; the project's patterns the formats it lacks; the prose
    detector what people say."""
    library = [k for _, _, k in DetectSecretsDetector().find("AKIAQ7CANARY4EXAMPLE1")]
    formats = [k for _, _, k in PatternDetector().find("use akiaq7canary4exampl1 today")]
    prose = [k for _, _, k in ProseDetector().find("my password is hunter2")]
    assert library == ["aws_key"] and formats == ["aws_key"] and prose == ["password"]
    assert not list(DetectSecretsDetector().find("my password is hunter2"))


class _Broken:
    name = "broken"

    def find(self, text: str) -> Iterable[Span]:
        raise RuntimeError("detector crashed")


class _Stubborn:
    """Reports the first character outside a placeholder, round after round: never satisfied."""

    name = "stubborn"

    def find(self, text: str) -> Iterable[Span]:
        covered = {i for m in PLACEHOLDER.finditer(text) for i in range(m.start(), m.end())}
        first = next(i for i in range(len(text)) if i not in covered)
        return [(first, first + 1, "stubborn")]


def test_a_failing_detector_refuses_instead_of_passing_text_through() -> None:
    """If any detector fails the text is not known to be safe: SecretFilterError, never the raw text."""
    with pytest.raises(SecretFilterError, match="detector broken failed"):
        SecretFilter([PatternDetector(), _Broken()]).scrub("hello")


def test_a_finding_that_survives_redaction_refuses() -> None:
    """The output is scanned again; findings left after the last round refuse the text."""
    with pytest.raises(SecretFilterError, match="findings remain"):
        SecretFilter([_Stubborn()]).scrub("hello world, once more and again")


def test_scrub_is_deterministic_and_cached(secret_filter: SecretFilter) -> None:
    """The same text gives the same result, served from the cache the second time."""
    text = "password: CanaryCached1"
    assert secret_filter.scrub(text) is secret_filter.scrub(text)
