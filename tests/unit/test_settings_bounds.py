"""Settings that would validate and then overflow a timer or a date later are refused when they load, naming
the setting: every duration is a finite number of seconds of at most MAX_DURATION_S."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.domain.errors import InvalidRequestError
from harness.kernel.thresholds import MAX_DURATION_S, Thresholds
from harness.service.settings import ServiceSettings
from harness.settings import Settings
from harness.webhooks.config import Delivery

#: the duration settings of harness.settings, each read from HARNESS_<NAME>
DURATIONS = ["llm_timeout_s", "execution_limit_s", "sandbox_lease_s", "lease_ttl_s", "sweep_interval_s",
             "decided_approval_s", "redrive_grace_s", "queue_max_wait_s", "drive_max_lag_s", "checkpoint_interval_s"]
ABSURD = ["inf", "1e400", "1e300", "nan", "-inf", str(MAX_DURATION_S * 2)]


def test_every_float_duration_of_the_settings_is_listed_here() -> None:
    """No duration setting escapes these tests: every float field ending in _s is in DURATIONS."""
    floats = {name for name, field in Settings.model_fields.items()
              if name.endswith("_s") and "float" in str(field.annotation)}
    assert floats == set(DURATIONS)


@pytest.mark.parametrize("value", ABSURD)
@pytest.mark.parametrize("name", DURATIONS)
def test_an_absurd_duration_is_refused_at_load_naming_the_setting(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                  value: str) -> None:
    """HARNESS_<NAME>=inf, nan or a number past the bound is an InvalidRequestError naming the setting."""
    monkeypatch.setenv(f"HARNESS_{name.upper()}", value)
    with pytest.raises(InvalidRequestError, match=name):
        Settings.from_env()


@pytest.mark.parametrize("name", DURATIONS)
def test_the_bound_itself_is_accepted(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A duration of exactly MAX_DURATION_S (366 days) loads."""
    monkeypatch.setenv(f"HARNESS_{name.upper()}", str(MAX_DURATION_S))
    assert getattr(Settings.from_env(), name) == MAX_DURATION_S


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_an_absurd_state_threshold_or_ceiling_factor_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """HARNESS_STATE_THRESHOLDS=PLANNING=inf (or nan) and an infinite heartbeat ceiling factor are refused."""
    monkeypatch.setenv("HARNESS_STATE_THRESHOLDS", f"PLANNING={value}")
    with pytest.raises(InvalidRequestError, match="PLANNING"):
        Settings.from_env()
    with pytest.raises(ValueError, match="PLANNING"):
        Thresholds.build({"PLANNING": float(value)})
    monkeypatch.delenv("HARNESS_STATE_THRESHOLDS")
    monkeypatch.setenv("HARNESS_HEARTBEAT_CEILING_FACTOR", value)
    with pytest.raises(InvalidRequestError, match="heartbeat_ceiling_factor"):
        Settings.from_env()


@pytest.mark.parametrize("name", ["housekeeping_interval_s", "poll_interval_s", "max_wait_s", "stream_lifetime_s",
                                  "session_ttl_s", "webhook_interval_s"])
def test_the_service_durations_are_bounded_alike(name: str) -> None:
    """The service's own durations refuse infinity and NaN, naming the setting."""
    for value in ("inf", "nan"):
        with pytest.raises(InvalidRequestError, match=name):
            ServiceSettings.from_env(**{name: value})


@pytest.mark.parametrize("name", ["backoff_s", "max_backoff_s", "lease_s"])
def test_the_webhook_delivery_durations_are_bounded_alike(name: str) -> None:
    """The webhooks file's retry schedule refuses an infinite backoff or lease."""
    with pytest.raises(ValidationError, match=name):
        Delivery.model_validate({name: "inf"})


def test_a_witness_url_with_an_invalid_host_name_is_named_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_CHECKPOINT_WITNESS=http://a..b/ is an InvalidRequestError naming the witness, not a resolver's
    UnicodeError."""
    monkeypatch.setenv("HARNESS_CHECKPOINT_WITNESS", "http://a..b/")
    with pytest.raises(InvalidRequestError, match="not a valid host name"):
        Settings.from_env()
