"""How long a Run may stay in each state before it counts as stuck (seed 000 §6.1, SPEC K7, S1, S2).

Pure data and functions, shared by the zombie sweeper (which resumes or forces the stuck Run) and the
service's metrics (which count the stuck Runs). `DEFAULT_THRESHOLDS_S` are the seed's values; a
deployment overrides any of them through its settings (`Settings.state_thresholds`), and `Thresholds`
is what the sweeper and the metrics are given.

EXECUTING's threshold follows the Run's execution limit and the deployment's sweep interval: the tool
controller's own timer ends a Run at the limit, and the sweeper, the second layer, only steps in one
sweep interval later (S2).
AWAITING_HITL has no fixed threshold: a waiting Run is stuck only once its approval request's own
deadline has passed (G3), or once its request was decided and the Run did not move (`decided_s`).

A live heartbeat exempts a Run from its threshold, not forever: past `ceiling_factor` times its
threshold the Run is forced on even with a heartbeat, so a worker whose heartbeat thread outlives a hung
step cannot hide it (S2: the sweeper is the backstop for a first-layer timer that hangs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from harness.kernel.states import FINAL, TRANSIENT, RunState

S = RunState

#: how often the sweeper looks for stuck Runs by default, in seconds (seed 000 §6.1); a deployment's own
#: is `Settings.sweep_interval_s`
SWEEP_INTERVAL_S = 30.0

#: transient states only carry a close reason into TRACING; they should never linger
TRANSIENT_THRESHOLD_S = 30.0

#: the Run's total execution limit by default (SPEC T5), which EXECUTING's default threshold follows; the
#: one definition, which the settings and the run manager take theirs from
DEFAULT_EXECUTION_LIMIT_S = 600.0

#: the longest any duration a deployment sets may be, in seconds (366 days): a threshold, an interval, a
#: timeout, a lease. Longer is a slip of the keyboard, and infinity or a number like 1e300 overflows the
#: clocks, timers and dates it reaches (a thread's wait, a deadline written as a date)
MAX_DURATION_S = 366 * 24 * 3600.0

DEFAULT_THRESHOLDS_S: Mapping[RunState, float | None] = MappingProxyType({
    S.CREATED: 30.0,
    S.PREPARING: 60.0,
    S.PLANNING: 180.0,
    S.POLICY_CHECK: 30.0,
    S.AWAITING_HITL: None,  # the approval request's deadline decides
    S.EXECUTING: DEFAULT_EXECUTION_LIMIT_S + SWEEP_INTERVAL_S,
    S.TRACING: 60.0,
    **{s: TRANSIENT_THRESHOLD_S for s in TRANSIENT},
})

#: kept for callers of earlier versions: the defaults
STATE_THRESHOLDS_S = DEFAULT_THRESHOLDS_S


def parse_overrides(text: str) -> dict[str, float]:
    """`STATE=seconds` pairs separated by commas (HARNESS_STATE_THRESHOLDS), e.g. "PLANNING=300,TRACING=120".

    ValueError names the pair that is wrong."""
    overrides: dict[str, float] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"{pair!r} is not STATE=seconds")
        try:
            overrides[name.strip().upper()] = float(value)
        except ValueError:
            raise ValueError(f"{pair!r}: {value.strip()!r} is not a number of seconds") from None
    return overrides


@dataclass(frozen=True)
class Thresholds:
    """The per-state thresholds a deployment runs with, the heartbeat ceiling and the decision backstop."""

    per_state: Mapping[RunState, float | None] = field(default_factory=lambda: DEFAULT_THRESHOLDS_S)
    #: past this many times its threshold a Run is forced on even while its lease is heartbeated
    ceiling_factor: float = 2.0
    #: how long a decided approval request may wait for its Run to move before the sweeper moves it
    decided_s: float = 30.0

    @classmethod
    def build(cls, overrides: Mapping[str, float] | None = None, *,
              execution_limit_s: float = DEFAULT_EXECUTION_LIMIT_S, sweep_interval_s: float = SWEEP_INTERVAL_S,
              ceiling_factor: float = 2.0, decided_s: float = 30.0) -> Thresholds:
        """The defaults, EXECUTING tied to `execution_limit_s` plus one `sweep_interval_s`, then `overrides`
        by state name.

        ValueError for an unknown or final state, AWAITING_HITL (its requests' deadlines decide), a
        threshold that is not a positive number of seconds up to MAX_DURATION_S, a sweep interval that is not
        positive, or a ceiling factor below 1."""
        if sweep_interval_s <= 0:
            raise ValueError(f"the sweep interval must be positive, not {sweep_interval_s}")
        per_state: dict[RunState, float | None] = dict(DEFAULT_THRESHOLDS_S)
        per_state[S.EXECUTING] = execution_limit_s + sweep_interval_s
        for name, seconds in (overrides or {}).items():
            try:
                state = RunState(name.upper())
            except ValueError:
                raise ValueError(f"no state named {name!r} has a threshold") from None
            if state in FINAL or state == S.AWAITING_HITL:
                raise ValueError(f"{state.value} has no threshold to set (final, or decided by approval deadlines)")
            if not 0 < seconds <= MAX_DURATION_S:  # not NaN either
                raise ValueError(f"the threshold of {state.value} must be a number of seconds above 0 and at most "
                                 f"{MAX_DURATION_S:.0f} (366 days), not {seconds}")
            per_state[state] = float(seconds)
        if ceiling_factor < 1:
            raise ValueError(f"the heartbeat ceiling factor must be at least 1, not {ceiling_factor}")
        if decided_s <= 0:
            raise ValueError(f"the decided-approval threshold must be positive, not {decided_s}")
        return cls(MappingProxyType(per_state), ceiling_factor, decided_s)

    def threshold(self, state: RunState) -> float | None:
        """Seconds a Run may stay in `state`; None when the state has no fixed limit (final, AWAITING_HITL)."""
        if state in FINAL:
            return None
        return self.per_state.get(state)

    def ceiling(self, state: RunState) -> float | None:
        """Seconds after which a Run in `state` is forced on even with a live heartbeat."""
        limit = self.threshold(state)
        return None if limit is None else limit * self.ceiling_factor


DEFAULT = Thresholds()


def threshold_for(state: RunState) -> float | None:
    """The default threshold of `state` (see Thresholds.threshold for a deployment's own)."""
    return DEFAULT.threshold(state)
