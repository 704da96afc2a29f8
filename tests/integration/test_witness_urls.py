"""A witness URL reaches public addresses only, like a callback: one that is, or resolves to, a loopback,
private, link-local or otherwise internal address is refused when it is configured, naming the URL and the
setting that allows it, unless the operator allows it there."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.adapters.sql.store import SqlStore
from harness.cli import app
from harness.domain.errors import InvalidRequestError
from harness.settings import WITNESS_ALLOW_INTERNAL_ENV, Settings

NAMES = {"witness.example": ["93.184.216.34"], "witness.internal": ["10.20.0.7"]}


def resolve(host: str) -> list[str]:
    if host not in NAMES:
        raise OSError("no such name")
    return NAMES[host]


@pytest.fixture(autouse=True)
def _no_witness_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HARNESS_CHECKPOINT_WITNESS", WITNESS_ALLOW_INTERNAL_ENV, "HARNESS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8077", "http://localhost:8077/", "https://[::1]/",
                                 "http://169.254.169.254/latest", "http://10.1.2.3", "https://witness.internal/",
                                 "http://0x7f000001:8077", "http://[::ffff:192.168.1.5]/"])
def test_a_witness_at_an_internal_address_is_refused_naming_the_url_and_the_setting(url: str) -> None:
    """Loopback, link-local, private and such addresses however spelt, or a name resolving to one: refused."""
    with pytest.raises(InvalidRequestError) as refused:
        Settings(checkpoint_witnesses=(url,)).check_witnesses(resolve=resolve)
    assert url in str(refused.value) and WITNESS_ALLOW_INTERNAL_ENV in str(refused.value)


def test_public_witnesses_and_directories_need_no_allowance(tmp_path: Path) -> None:
    """A public address, a name resolving to one, a name that does not resolve yet and a folder pass."""
    Settings(checkpoint_witnesses=("https://witness.example/", "http://93.184.216.34:8077", "https://not-yet.example",
                                   str(tmp_path / "witness"))).check_witnesses(resolve=resolve)


def test_the_operator_allows_an_internal_witness_by_host_address_or_network() -> None:
    """witness_allow_internal lets exactly the hosts, addresses and networks it names through, `*` all."""
    for allowed, url in (("witness.internal", "https://witness.internal/"), ("127.0.0.1", "http://127.0.0.1:8077"),
                         ("10.0.0.0/8", "http://10.1.2.3"), ("*", "http://169.254.169.254/")):
        Settings(checkpoint_witnesses=(url,), witness_allow_internal=(allowed,)).check_witnesses(resolve=resolve)
    with pytest.raises(InvalidRequestError, match=r"10\.1\.2\.3"):
        Settings(checkpoint_witnesses=("http://10.1.2.3",),
                 witness_allow_internal=("192.168.0.0/16",)).check_witnesses(resolve=resolve)


def test_settings_refuse_an_internal_witness_when_they_are_read(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """HARNESS_CHECKPOINT_WITNESS at a loopback address fails Settings.from_env (at start, not at the first
    checkpoint); HARNESS_WITNESS_ALLOW_INTERNAL or the config file's witness_allow_internal allow it; a bad
    allow-list entry is named."""
    monkeypatch.setenv("HARNESS_CHECKPOINT_WITNESS", "http://127.0.0.1:8077")
    with pytest.raises(InvalidRequestError, match=r"http://127\.0\.0\.1:8077.*HARNESS_WITNESS_ALLOW_INTERNAL"):
        Settings.from_env()
    monkeypatch.setenv(WITNESS_ALLOW_INTERNAL_ENV, "127.0.0.1, 10.0.0.0/8")
    assert Settings.from_env().witness_allow_internal == ("127.0.0.1", "10.0.0.0/8")
    monkeypatch.delenv(WITNESS_ALLOW_INTERNAL_ENV)
    config = tmp_path / "harness.yaml"
    config.write_text("witness_allow_internal: [127.0.0.1]\n")
    monkeypatch.setenv("HARNESS_CONFIG_FILE", str(config))
    assert Settings.from_env().checkpoint_witnesses == ("http://127.0.0.1:8077",)
    monkeypatch.setenv(WITNESS_ALLOW_INTERNAL_ENV, "not a host!")
    with pytest.raises(InvalidRequestError, match="not a host!"):
        Settings.from_env()


def test_the_command_line_refuses_an_internal_witness_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    """`harness audit checkpoint --witness http://127.0.0.1:…` exits 2 before anything is published, saying
    which URL and which setting; with the setting it publishes (the witness, down, is only not reached)."""
    SqlStore.open(str(tmp_path / "h.db")).close()
    args = ["audit", "checkpoint", "--db", str(tmp_path / "h.db"), "--dir", str(tmp_path / "cps"),
            "--witness", "http://127.0.0.1:9"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert "http://127.0.0.1:9" in refused.output and WITNESS_ALLOW_INTERNAL_ENV in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "cps").exists()
    allowed = CliRunner().invoke(app, args, env={WITNESS_ALLOW_INTERNAL_ENV: "127.0.0.1"})
    assert allowed.exit_code == 1 and "unreachable" in allowed.output, allowed.output
