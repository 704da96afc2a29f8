"""Circuit breakers and per-call retries (SPEC T3), on a fake clock: no test here sleeps."""

from __future__ import annotations

import pytest

from harness.clock import FakeClock
from harness.domain.errors import ProviderError
from harness.pipeline.resilience import (
    BreakerConfig,
    BreakerRegistry,
    BreakerState,
    CircuitBreaker,
    CircuitOpenError,
    RetryQuota,
    retry_call,
)


def state(breaker: CircuitBreaker) -> BreakerState:
    """The breaker's state, read afresh (a function call, so type checkers do not narrow it)."""
    return breaker.state


def failing() -> None:
    raise ProviderError("boom", kind="server_error", retryable=True)


def trip(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(ProviderError):
            breaker.call(failing)


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    """Opens after 3 consecutive failures, for 30 s."""
    return CircuitBreaker("model:m", clock, BreakerConfig(failure_threshold=3, reset_timeout=30.0))


def test_opens_at_the_threshold_and_then_refuses_without_calling(breaker: CircuitBreaker) -> None:
    """Consecutive failures up to the threshold open the breaker; an open breaker never calls through."""
    trip(breaker, 2)
    assert state(breaker) is BreakerState.CLOSED
    trip(breaker, 1)
    assert state(breaker) is BreakerState.OPEN
    called = []
    with pytest.raises(CircuitOpenError) as info:
        breaker.call(lambda: called.append(1))
    assert called == [] and info.value.name == "model:m"


def test_a_success_resets_the_failure_count(breaker: CircuitBreaker) -> None:
    """Only consecutive failures count: a success in between keeps the breaker closed."""
    trip(breaker, 2)
    assert breaker.call(lambda: "ok") == "ok"
    trip(breaker, 2)
    assert state(breaker) is BreakerState.CLOSED and breaker.failures == 2


def test_half_open_after_the_timeout_allows_one_trial_that_closes_it(breaker: CircuitBreaker,
                                                                     clock: FakeClock) -> None:
    """After reset_timeout on the clock one trial call goes through; its success closes the breaker."""
    trip(breaker, 3)
    clock.advance(29.9)
    assert state(breaker) is BreakerState.OPEN
    clock.advance(0.1)
    assert state(breaker) is BreakerState.HALF_OPEN
    assert breaker.allow() is True
    assert breaker.allow() is False  # only one trial at a time
    breaker.record_success()
    assert state(breaker) is BreakerState.CLOSED and breaker.failures == 0


def test_a_failed_trial_reopens_for_a_full_timeout(breaker: CircuitBreaker, clock: FakeClock) -> None:
    """A half-open trial that fails opens the breaker again, counted from the trial, not the first trip."""
    trip(breaker, 3)
    clock.advance(30)
    trip(breaker, 1)
    assert state(breaker) is BreakerState.OPEN
    clock.advance(29)
    assert state(breaker) is BreakerState.OPEN
    clock.advance(1)
    assert state(breaker) is BreakerState.HALF_OPEN


def test_exceptions_that_do_not_count_leave_the_breaker_alone(breaker: CircuitBreaker,
                                                               clock: FakeClock) -> None:
    """A failure the caller says is not the dependency's fault neither trips nor uses up a trial."""
    def bad_request() -> None:
        raise ProviderError("bad", kind="client_error", retryable=False)

    def counts(exc: BaseException) -> bool:
        return isinstance(exc, ProviderError) and exc.retryable

    for _ in range(5):
        with pytest.raises(ProviderError):
            breaker.call(bad_request, counts=counts)
    assert state(breaker) is BreakerState.CLOSED
    trip(breaker, 3)
    clock.advance(30)
    with pytest.raises(ProviderError):
        breaker.call(bad_request, counts=counts)
    assert breaker.allow() is True  # the uncounted trial was given back


def test_listeners_see_every_state_change_in_order(breaker: CircuitBreaker, clock: FakeClock) -> None:
    """Subscribers get (name, old, new) for each change, so the switch can be traced."""
    seen: list[tuple[str, str, str]] = []
    breaker.subscribe(lambda name, old, new: seen.append((name, old.value, new.value)))
    trip(breaker, 3)
    clock.advance(30)
    breaker.call(lambda: None)
    assert seen == [("model:m", "closed", "open"), ("model:m", "open", "half_open"),
                    ("model:m", "half_open", "closed")]


def test_registry_gives_one_breaker_per_name(clock: FakeClock) -> None:
    """The same name always yields the same breaker; registry listeners reach breakers made later."""
    registry = BreakerRegistry(clock, BreakerConfig(failure_threshold=1))
    seen: list[str] = []
    registry.subscribe(lambda name, _old, new: seen.append(f"{name}:{new.value}"))
    first = registry.get("skill:a")
    assert registry.get("skill:a") is first and registry.get("skill:b") is not first
    trip(registry.get("skill:b"), 1)
    assert registry.states() == {"skill:a": BreakerState.CLOSED, "skill:b": BreakerState.OPEN}
    assert seen == ["skill:b:open"]


def test_config_is_validated() -> None:
    """A breaker that could never open (threshold 0) is refused at configuration time."""
    with pytest.raises(ValueError, match="failure_threshold"):
        BreakerConfig(failure_threshold=0)


class Flaky:
    """Fails with the given errors, then answers."""

    def __init__(self, *errors: ProviderError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "answer"


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


def hint(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, ProviderError) else None


def test_retryable_errors_are_retried_within_the_quota() -> None:
    """5xx is retried up to max_attempts with growing backoff; the last error is re-raised unchanged."""
    sleeps: list[float] = []
    errors = [ProviderError(f"5xx #{i}", kind="server_error", retryable=True) for i in range(4)]
    flaky = Flaky(*errors)
    quota = RetryQuota(max_attempts=3, backoff_s=0.1, max_backoff_s=10)
    with pytest.raises(ProviderError, match="5xx #2"):
        retry_call(flaky, quota, retryable=is_retryable, sleep=sleeps.append)
    assert flaky.calls == 3 and len(sleeps) == 2
    assert 0.1 <= sleeps[0] <= 0.2 and 0.2 <= sleeps[1] <= 0.3  # exponential, plus jitter of at most 0.1


def test_on_retry_hears_of_each_failure_that_is_retried_with_its_wait() -> None:
    """Each failed attempt that goes again is told, with its number and the wait before the next one (the
    wait that is then slept); the last failure, re-raised, is not: its caller says it failed."""
    heard: list[tuple[str, int, float]] = []
    sleeps: list[float] = []
    flaky = Flaky(*[ProviderError(f"5xx #{i}", kind="server_error", retryable=True) for i in range(3)])
    with pytest.raises(ProviderError, match="5xx #2"):
        retry_call(flaky, RetryQuota(max_attempts=3, backoff_s=0.1), retryable=is_retryable, sleep=sleeps.append,
                   on_retry=lambda exc, attempt, wait: heard.append((str(exc), attempt, wait)))
    assert [(text, attempt) for text, attempt, _ in heard] == [("5xx #0", 1), ("5xx #1", 2)]
    assert [wait for *_, wait in heard] == sleeps


def test_non_retryable_errors_fail_at_once() -> None:
    """Auth, billing, context-length and other 4xx errors are never retried."""
    for kind in ("auth", "billing", "context_length", "client_error"):
        flaky = Flaky(ProviderError(kind, kind=kind, retryable=False))
        with pytest.raises(ProviderError):
            retry_call(flaky, RetryQuota(), retryable=is_retryable, sleep=lambda _s: None)
        assert flaky.calls == 1, kind


def test_retry_after_is_honoured() -> None:
    """A 429's retry-after sets the wait when it is longer than the backoff."""
    sleeps: list[float] = []
    flaky = Flaky(ProviderError("429", kind="rate_limit", retryable=True, retry_after=2.5))
    assert retry_call(flaky, RetryQuota(backoff_s=0.01), retryable=is_retryable, retry_after=hint,
                      sleep=sleeps.append) == "answer"
    assert sleeps == [2.5]


def test_a_retry_after_beyond_the_waiting_budget_ends_retries_now() -> None:
    """A server asking for more waiting than the call has left gets no retry: the caller learns at once."""
    sleeps: list[float] = []
    flaky = Flaky(ProviderError("429", kind="rate_limit", retryable=True, retry_after=120))
    with pytest.raises(ProviderError, match="429"):
        retry_call(flaky, RetryQuota(max_wait_s=30), retryable=is_retryable, retry_after=hint,
                   sleep=sleeps.append)
    assert flaky.calls == 1 and sleeps == []
