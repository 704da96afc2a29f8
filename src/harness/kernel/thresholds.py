"""How long a Run may stay in each state before it counts as stuck (seed 000 §6.1, SPEC K7, S1).

Pure data, shared by the zombie sweeper (which forces the stuck Run on) and the service's metrics
(which count the stuck Runs). These are the defaults; deployments override them through config.
AWAITING_HITL has no fixed threshold: a waiting Run is stuck only once its approval request's own
deadline has passed (G3), so its entry is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from harness.kernel.states import FINAL, TRANSIENT, RunState

S = RunState

#: how often the sweeper looks for stuck Runs, in seconds (seed 000 §6.1)
SWEEP_INTERVAL_S = 30.0

#: transient states only carry a close reason into TRACING; they should never linger
TRANSIENT_THRESHOLD_S = 30.0

STATE_THRESHOLDS_S: Mapping[RunState, float | None] = MappingProxyType({
    S.CREATED: 30.0,
    S.PREPARING: 60.0,
    S.PLANNING: 180.0,
    S.POLICY_CHECK: 30.0,
    S.AWAITING_HITL: None,  # the approval request's deadline decides
    S.EXECUTING: 600.0,
    S.TRACING: 60.0,
    **{s: TRANSIENT_THRESHOLD_S for s in TRANSIENT},
})


def threshold_for(state: RunState) -> float | None:
    """Seconds a Run may stay in `state`; None when the state has no fixed limit (final, AWAITING_HITL)."""
    if state in FINAL:
        return None
    return STATE_THRESHOLDS_S[state]
