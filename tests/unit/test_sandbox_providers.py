"""Which sandbox provider runs a call is a setting: everything remote, or only some tenants' or some skills'
calls; a remote choice without a server's URL is refused before any Run starts."""

from __future__ import annotations

from typing import Any, cast

import pytest

from harness.adapters.sandbox.providers import ProviderChoice
from harness.domain.errors import InvalidRequestError
from harness.settings import Settings
from harness.wiring.sandbox import sandbox_provider


class Named:
    """A stand-in sandbox that only has a name."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.isolation = "bwrap"

    def run(self, *_: Any) -> Any:
        raise AssertionError("not run here")

    start_instance = run_in = run


def test_the_listed_tenants_and_skills_go_to_the_remote_provider() -> None:
    """With the local provider by default, a listed tenant's calls and a listed skill's calls go remote; the
    local sandbox is made only when a call needs it."""
    made: list[Named] = []

    def local() -> Named:
        made.append(Named("local"))
        return made[-1]

    choice = ProviderChoice(local, Named("remote"), remote_tenants={"acme"}, remote_skills={"code.build"})
    assert cast(Named, choice.for_call("code.build", "other")).provider == "remote"
    assert cast(Named, choice.for_call("text.say", "acme")).provider == "remote"
    assert made == []
    assert cast(Named, choice.for_call("text.say", "other")).provider == "local" and len(made) == 1
    everything = ProviderChoice(lambda: Named("local"), Named("remote"), default="remote")
    assert cast(Named, everything.for_call("text.say", "other")).provider == "remote"


def test_the_settings_name_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_SANDBOX_PROVIDER, _URL and the comma-separated lists are read from the environment; remote
    without a URL is a clear error."""
    monkeypatch.setenv("HARNESS_SANDBOX_PROVIDER", "remote")
    monkeypatch.setenv("HARNESS_SANDBOX_REMOTE_TENANTS", "acme, beta,")
    settings = Settings.from_env()
    assert settings.sandbox_provider == "remote" and settings.sandbox_remote_tenants == ("acme", "beta")
    with pytest.raises(InvalidRequestError, match="HARNESS_SANDBOX_URL"):
        sandbox_provider(settings)
    monkeypatch.setenv("HARNESS_SANDBOX_URL", "http://127.0.0.1:9")
    remote = sandbox_provider(Settings.from_env())
    assert getattr(remote, "provider", None) == "remote" and getattr(remote, "url", None) == "http://127.0.0.1:9"
