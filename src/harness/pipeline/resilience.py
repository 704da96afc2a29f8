"""Circuit breakers shared by the LLM providers (per model) and the tool controller (per skill), SPEC T3.

A breaker counts consecutive failures. At `failure_threshold` it opens: calls are refused at once
(CircuitOpenError) so the caller can switch to its fallback instead of waiting on a sick dependency.
After `reset_timeout` seconds on the injected clock it lets `half_open_max_calls` trial calls through
(half-open); a trial success closes it, a trial failure opens it again for another `reset_timeout`.
Time comes only from the Clock port, so tests move a FakeClock instead of sleeping.

`retry_call` is the other half of T3: transient failures are retried with exponential backoff and
jitter (tenacity), honouring a server's retry-after, within a per-call quota of attempts and waiting.

Typical use::

    breaker = registry.get("model:gpt-4o")
    try:
        result = breaker.call(lambda: provider.complete(request))
    except CircuitOpenError:
        result = fallback()          # and trace the switch
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential_jitter

from harness.domain.errors import HarnessError
from harness.ports import Clock

T = TypeVar("T")


class BreakerState(StrEnum):
    """The three states of a circuit breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """When a breaker opens and how long it stays open."""

    failure_threshold: int = 5
    reset_timeout: float = 30.0
    half_open_max_calls: int = 1

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.half_open_max_calls < 1 or self.reset_timeout < 0:
            raise ValueError("breaker needs failure_threshold >= 1, half_open_max_calls >= 1, "
                             "reset_timeout >= 0")


class CircuitOpenError(HarnessError):
    """The breaker refused the call without trying it; `retry_at` is when it will allow a trial."""

    def __init__(self, name: str, retry_at: float) -> None:
        super().__init__(f"circuit {name!r} is open until {retry_at:.3f}")
        self.name = name
        self.retry_at = retry_at


StateListener = Callable[[str, BreakerState, BreakerState], None]


@dataclass
class _Counters:
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    trials: int = 0


@dataclass
class CircuitBreaker:
    """One breaker, keyed by `name` (e.g. "model:gpt-4o" or "skill:refunds.issue"); thread-safe."""

    name: str
    clock: Clock
    config: BreakerConfig = field(default_factory=BreakerConfig)
    _c: _Counters = field(default_factory=_Counters, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _listeners: list[StateListener] = field(default_factory=list, init=False, repr=False)

    def subscribe(self, listener: StateListener) -> None:
        """Call `listener(name, old, new)` on every state change (for tracing and metrics)."""
        self._listeners.append(listener)

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose timeout has passed reports half-open."""
        with self._lock:
            changes = self._expire_open()
        self._notify(changes)
        return self._c.state

    @property
    def failures(self) -> int:
        """Consecutive failures counted since the last success."""
        return self._c.failures

    def allow(self) -> bool:
        """Claim permission for one call; False means refuse it (the breaker is open)."""
        with self._lock:
            changes = self._expire_open()
            allowed = self._claim()
        self._notify(changes)
        return allowed

    def retry_at(self) -> float:
        """When an open breaker will let a trial call through."""
        return self._c.opened_at + self.config.reset_timeout

    def record_success(self) -> None:
        """A call succeeded: close the breaker and forget past failures."""
        with self._lock:
            changes = self._move(BreakerState.CLOSED)
            self._c.failures = 0
            self._c.trials = 0
        self._notify(changes)

    def record_failure(self) -> None:
        """A call failed: a half-open trial reopens at once; otherwise open at the threshold."""
        with self._lock:
            self._c.failures += 1
            threshold = self._c.failures >= self.config.failure_threshold
            trip = self._c.state is BreakerState.HALF_OPEN or threshold
            changes = self._open() if trip else []
        self._notify(changes)

    def call(self, fn: Callable[[], T], *, counts: Callable[[BaseException], bool] | None = None) -> T:
        """Run `fn` through the breaker. `counts(exc)` decides whether an exception is a failure
        (default: every exception); an exception that does not count leaves the breaker as it was."""
        if not self.allow():
            raise CircuitOpenError(self.name, self.retry_at())
        try:
            result = fn()
        except BaseException as exc:
            if counts is None or counts(exc):
                self.record_failure()
            else:
                self._release_trial()
            raise
        self.record_success()
        return result

    def reset(self) -> None:
        """Force the breaker closed (operator action)."""
        self.record_success()

    # -- internals; callers hold the lock -------------------------------------------------------

    def _claim(self) -> bool:
        if self._c.state is BreakerState.CLOSED:
            return True
        if self._c.state is BreakerState.HALF_OPEN and self._c.trials < self.config.half_open_max_calls:
            self._c.trials += 1
            return True
        return False

    def _release_trial(self) -> None:
        with self._lock:
            if self._c.state is BreakerState.HALF_OPEN and self._c.trials > 0:
                self._c.trials -= 1

    def _expire_open(self) -> list[tuple[BreakerState, BreakerState]]:
        if self._c.state is BreakerState.OPEN and self.clock.now() >= self.retry_at():
            self._c.trials = 0
            return self._move(BreakerState.HALF_OPEN)
        return []

    def _open(self) -> list[tuple[BreakerState, BreakerState]]:
        self._c.opened_at = self.clock.now()
        self._c.trials = 0
        return self._move(BreakerState.OPEN)

    def _move(self, new: BreakerState) -> list[tuple[BreakerState, BreakerState]]:
        old = self._c.state
        self._c.state = new
        return [] if old is new else [(old, new)]

    def _notify(self, changes: list[tuple[BreakerState, BreakerState]]) -> None:
        # Outside the lock, so a listener may read the breaker without deadlocking.
        for old, new in changes:
            for listener in list(self._listeners):
                listener(self.name, old, new)


class BreakerRegistry:
    """Breakers by name, created on first use with the registry's default config; thread-safe."""

    def __init__(self, clock: Clock, default: BreakerConfig | None = None) -> None:
        self._clock = clock
        self._default = default or BreakerConfig()
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()
        self._listeners: list[StateListener] = []

    def get(self, name: str, config: BreakerConfig | None = None) -> CircuitBreaker:
        """The breaker for `name`; `config` applies only when this call creates it."""
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = CircuitBreaker(name, self._clock, config or self._default)
                for listener in self._listeners:
                    breaker.subscribe(listener)
                self._breakers[name] = breaker
            return breaker

    def subscribe(self, listener: StateListener) -> None:
        """Listen to state changes of every breaker, present and future."""
        with self._lock:
            self._listeners.append(listener)
            for breaker in self._breakers.values():
                breaker.subscribe(listener)

    def states(self) -> dict[str, BreakerState]:
        """Every known breaker's current state (for health endpoints and tests)."""
        with self._lock:
            breakers = list(self._breakers.values())
        return {b.name: b.state for b in breakers}


@dataclass(frozen=True)
class RetryQuota:
    """What one call may spend on transient failures: attempts, backoff, and total waiting (T3).

    A retry-after longer than the waiting left ends the retries at once: the caller learns now,
    rather than after a wait it could not afford."""

    max_attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_wait_s: float = 30.0


def retry_call(
    fn: Callable[[], T],
    quota: RetryQuota,
    *,
    retryable: Callable[[BaseException], bool],
    retry_after: Callable[[BaseException], float | None] = lambda _exc: None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[BaseException, int, float], None] | None = None,
) -> T:
    """Call `fn`, retrying exceptions `retryable` accepts; the last exception is re-raised as is.
    `on_retry(exc, attempt, wait_s)` hears of each failed attempt that will be retried, before the wait."""
    backoff = wait_exponential_jitter(multiplier=quota.backoff_s, max=quota.max_backoff_s,
                                      jitter=quota.backoff_s)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        hinted = retry_after(exc) if exc is not None else None
        return max(float(hinted or 0.0), backoff(state))

    def stop(state: RetryCallState) -> bool:
        over_budget = state.idle_for + state.upcoming_sleep > quota.max_wait_s
        return state.attempt_number >= quota.max_attempts or over_budget

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and exc is not None:
            on_retry(exc, state.attempt_number, state.upcoming_sleep)

    retrying = Retrying(stop=stop, wait=wait, retry=retry_if_exception(retryable), sleep=sleep, reraise=True,
                        before_sleep=before_sleep)
    return retrying(fn)
