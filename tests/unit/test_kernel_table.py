"""The pure kernel against SPEC K1-K3 and K6: the whitelist, the funnel, the closing rule, the projection.

The expected values below are written out from the SPEC and seed 000 §3.1/§4.2/§5.1 by hand, not derived
from the kernel, so a change to the kernel's tables that the SPEC does not sanction fails here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import pairwise

import pytest

from harness.kernel.events import FINAL_EVENT, audit_events_for
from harness.kernel.projection import JobStatus, job_status
from harness.kernel.states import FINAL, NON_FINAL, TRANSIENT, CloseReason, RunState, is_final
from harness.kernel.transitions import (
    LEGAL,
    TABLE,
    automatic_next,
    close_reason_on_entry,
    exit_reasons,
    final_state_for,
    is_legal,
    keeps_close_reason,
    targets_from,
)

S = RunState

#: seed 000 §3.1, row by row
SEED_TABLE: frozenset[tuple[RunState, RunState]] = frozenset({
    (S.CREATED, S.PREPARING),
    (S.PREPARING, S.PLANNING),
    (S.PREPARING, S.FAILED),
    (S.PLANNING, S.POLICY_CHECK),
    (S.PLANNING, S.FAILED),
    (S.PLANNING, S.TIMEOUT),
    (S.POLICY_CHECK, S.EXECUTING),
    (S.POLICY_CHECK, S.AWAITING_HITL),
    (S.POLICY_CHECK, S.REJECTED),
    (S.AWAITING_HITL, S.EXECUTING),
    (S.AWAITING_HITL, S.REJECTED),
    (S.AWAITING_HITL, S.TIMEOUT),
    (S.AWAITING_HITL, S.CANCELLED),
    (S.EXECUTING, S.TRACING),
    (S.EXECUTING, S.FAILED),
    (S.EXECUTING, S.TIMEOUT),
    (S.EXECUTING, S.CANCELLED),
    (S.REJECTED, S.TRACING),
    (S.FAILED, S.TRACING),
    (S.TIMEOUT, S.TRACING),
    (S.CANCELLED, S.TRACING),
    (S.TRACING, S.SUCCEEDED),
    (S.TRACING, S.CLOSED_REJECTED),
    (S.TRACING, S.CLOSED_FAILED),
    (S.TRACING, S.CLOSED_CANCELLED),
})

#: SPEC K2's documented extensions
SWEEPER_EXTENSIONS = frozenset({(S.CREATED, S.FAILED), (S.POLICY_CHECK, S.FAILED), (S.TRACING, S.FAILED)})
CANCEL_EXTENSIONS = frozenset(
    {(S.PREPARING, S.CANCELLED), (S.PLANNING, S.CANCELLED), (S.POLICY_CHECK, S.CANCELLED)}
)
#: SPEC K2 amendment (rounds): the next round of a multi-round Run
ROUNDS_EXTENSION = frozenset({(S.EXECUTING, S.PLANNING)})
EXPECTED_TABLE = SEED_TABLE | SWEEPER_EXTENSIONS | CANCEL_EXTENSIONS | ROUNDS_EXTENSION

#: seed 000 §5.1
EXPECTED_PROJECTION: dict[RunState, str] = {
    S.CREATED: "pending",
    S.PREPARING: "pending",
    S.PLANNING: "pending",
    S.POLICY_CHECK: "pending",
    S.EXECUTING: "running",
    S.AWAITING_HITL: "running",
    S.TRACING: "running",
    S.REJECTED: "running",
    S.FAILED: "running",
    S.TIMEOUT: "running",
    S.CANCELLED: "running",
    S.SUCCEEDED: "done",
    S.CLOSED_REJECTED: "failed",
    S.CLOSED_FAILED: "failed",
    S.CLOSED_CANCELLED: "failed",
}


def _expected_final(path: list[RunState]) -> RunState:
    """SPEC K3 stated independently of the kernel: TRACING's exit from how TRACING was last entered."""
    entry = max(i for i, s in enumerate(path) if s == S.TRACING)
    before = path[entry - 1]
    if before == S.EXECUTING:
        return S.SUCCEEDED
    if before == S.TIMEOUT:
        return S.CLOSED_REJECTED if path[entry - 2] == S.AWAITING_HITL else S.CLOSED_FAILED
    return {S.REJECTED: S.CLOSED_REJECTED, S.FAILED: S.CLOSED_FAILED, S.CANCELLED: S.CLOSED_CANCELLED}[before]


def _reason_along(path: list[RunState]) -> CloseReason | None:
    """The close reason the kernel carries after walking `path` from CREATED."""
    reason: CloseReason | None = None
    for source, target in pairwise(path):
        reason = close_reason_on_entry(source, target, reason)
    return reason


def _paths_to_tracing(max_visits_of_tracing: int = 3, max_rounds: int = 3) -> Iterator[list[RunState]]:
    """Every path over the table from CREATED that ends in TRACING (TRACING→FAILED loops and rounds,
    EXECUTING→PLANNING, bounded)."""
    stack: list[list[RunState]] = [[S.CREATED]]
    while stack:
        path = stack.pop()
        if path[-1] == S.TRACING:
            yield path
        if path.count(S.TRACING) >= max_visits_of_tracing or path.count(S.PLANNING) > max_rounds:
            continue
        for target in targets_from(path[-1]):
            if target not in FINAL:
                stack.append([*path, target])


def _reachable(start: RunState, edges: frozenset[tuple[RunState, RunState]]) -> set[RunState]:
    seen, queue = {start}, deque([start])
    while queue:
        state = queue.popleft()
        for source, target in edges:
            if source == state and target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def test_fifteen_states_in_four_phases() -> None:
    """K1: exactly fifteen states: six main, one funnel, four transient, four final."""
    assert len(RunState) == 15
    assert {S.REJECTED, S.FAILED, S.TIMEOUT, S.CANCELLED} == TRANSIENT
    assert {S.SUCCEEDED, S.CLOSED_REJECTED, S.CLOSED_FAILED, S.CLOSED_CANCELLED} == FINAL
    assert frozenset(RunState) - FINAL == NON_FINAL
    assert len(NON_FINAL) == 11
    assert all(is_final(s) == (s in FINAL) for s in RunState)


def test_table_is_exactly_the_seed_table_plus_documented_extensions() -> None:
    """K2: the whitelist is seed 000 §3.1 plus the seven documented extensions, nothing more or less."""
    assert set(LEGAL) - EXPECTED_TABLE == set(), "edges the SPEC does not allow"
    assert EXPECTED_TABLE - set(LEGAL) == set(), "SPEC edges missing from the table"
    assert len(EXPECTED_TABLE) == 32


def test_table_lists_each_edge_once() -> None:
    """K2: the table is one place of data, so no edge appears twice with different triggers or guards."""
    assert len(TABLE) == len(LEGAL)
    assert all(e.trigger and e.guard for e in TABLE)


def test_is_legal_agrees_with_the_spec_for_every_pair() -> None:
    """K2: is_legal accepts exactly the SPEC's pairs among all 225 (source, target) pairs."""
    wrong = [(s, t) for s in RunState for t in RunState if is_legal(s, t) != ((s, t) in EXPECTED_TABLE)]
    assert wrong == []


@pytest.mark.parametrize(
    ("source", "target"),
    [
        *[(s, S.CREATED) for s in RunState],
        (S.FAILED, S.EXECUTING),
        (S.EXECUTING, S.CLOSED_FAILED),
        (S.POLICY_CHECK, S.SUCCEEDED),
        (S.CLOSED_FAILED, S.PREPARING),
        (S.EXECUTING, S.SUCCEEDED),
        (S.AWAITING_HITL, S.CLOSED_REJECTED),
    ],
)
def test_seed_forbidden_examples_are_illegal(source: RunState, target: RunState) -> None:
    """Seed 000 §3.2: no reset to CREATED, no in-place retry, no skipping FAILED/EXECUTING/TRACING."""
    assert not is_legal(source, target)


@pytest.mark.parametrize("final", sorted(FINAL))
def test_final_states_have_no_exits(final: RunState) -> None:
    """K5: a final state is irreversible, so the table has no edge out of it."""
    assert targets_from(final) == frozenset()
    assert automatic_next(final, None) is None


def test_every_edge_into_a_final_state_comes_from_tracing() -> None:
    """K3: TRACING is immediately before every final state."""
    into_final = {(s, t) for s, t in LEGAL if t in FINAL}
    assert into_final
    assert {s for s, _ in into_final} == {S.TRACING}


def test_no_final_state_is_reachable_once_tracing_is_removed() -> None:
    """K3: every path from CREATED into a final state passes TRACING (graph search without TRACING)."""
    without_tracing = frozenset((s, t) for s, t in LEGAL if S.TRACING not in (s, t))
    assert _reachable(S.CREATED, without_tracing) & FINAL == set()


def test_every_state_is_reachable_from_created() -> None:
    """K1/K2: no state is dead data; each one is reachable from CREATED over the table."""
    assert _reachable(S.CREATED, LEGAL) == set(RunState)


@pytest.mark.parametrize("state", sorted(NON_FINAL))
def test_every_non_final_state_can_still_close(state: RunState) -> None:
    """K3: no non-final state is a dead end; each can still reach a final state."""
    assert _reachable(state, LEGAL) & FINAL


@pytest.mark.parametrize("transient", sorted(TRANSIENT))
def test_transient_states_only_funnel_into_tracing(transient: RunState) -> None:
    """K3: a transient state's only exit is TRACING, and the kernel takes it by itself."""
    assert targets_from(transient) == {S.TRACING}
    for reason in [None, *CloseReason]:
        assert automatic_next(transient, reason) == S.TRACING


@pytest.mark.parametrize(
    "state", [S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.EXECUTING]
)
def test_main_path_states_never_move_by_themselves(state: RunState) -> None:
    """K3: only transient states and TRACING auto-advance; main-path states wait for a component."""
    assert automatic_next(state, None) is None


def test_tracing_without_a_close_reason_is_refused() -> None:
    """K3: TRACING's exit needs a close reason; the kernel never guesses one."""
    with pytest.raises(ValueError, match="close reason"):
        automatic_next(S.TRACING, None)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING], S.SUCCEEDED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.EXECUTING, S.TRACING],
         S.SUCCEEDED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.REJECTED, S.TRACING], S.CLOSED_REJECTED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.REJECTED, S.TRACING],
         S.CLOSED_REJECTED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.TIMEOUT, S.TRACING],
         S.CLOSED_REJECTED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TIMEOUT, S.TRACING],
         S.CLOSED_FAILED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.TIMEOUT, S.TRACING], S.CLOSED_FAILED),
        ([S.CREATED, S.PREPARING, S.FAILED, S.TRACING], S.CLOSED_FAILED),
        ([S.CREATED, S.FAILED, S.TRACING], S.CLOSED_FAILED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.FAILED, S.TRACING],
         S.CLOSED_FAILED),
        ([S.CREATED, S.PREPARING, S.CANCELLED, S.TRACING], S.CLOSED_CANCELLED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.CANCELLED, S.TRACING],
         S.CLOSED_CANCELLED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.CANCELLED, S.TRACING],
         S.CLOSED_CANCELLED),
        # the sweeper finds the trace write stuck: the Run closes as failed whatever it was
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING, S.FAILED, S.TRACING],
         S.CLOSED_FAILED),
        ([S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.TIMEOUT, S.TRACING, S.FAILED,
          S.TRACING], S.CLOSED_FAILED),
    ],
)
def test_tracing_exit_for_each_k3_case(path: list[RunState], expected: RunState) -> None:
    """K3: each way of entering TRACING closes the Run in the state the SPEC names for it."""
    assert all(is_legal(s, t) for s, t in pairwise(path)), "case is not a legal path"
    reason = _reason_along(path)
    assert reason is not None
    assert automatic_next(S.TRACING, reason) == expected
    assert is_legal(S.TRACING, expected)


def test_tracing_exit_is_decided_by_how_it_was_entered_on_every_path() -> None:
    """K3: over every path CREATED→…→TRACING in the table, the carried close reason names the SPEC's exit."""
    checked = multi_round = 0
    for path in _paths_to_tracing():
        reason = _reason_along(path)
        assert reason is not None, path
        assert final_state_for(reason) == _expected_final(path), path
        checked += 1
        multi_round += path.count(S.PLANNING) > 1
    assert checked > 20 and multi_round > 0  # paths through later rounds close by the same rule


def test_hitl_timeout_is_default_deny_and_other_timeouts_are_failures() -> None:
    """K3: TIMEOUT from AWAITING_HITL closes rejected; TIMEOUT from PLANNING or EXECUTING closes failed."""
    assert close_reason_on_entry(S.AWAITING_HITL, S.TIMEOUT, None) == CloseReason.HITL_TIMEOUT
    assert final_state_for(CloseReason.HITL_TIMEOUT) == S.CLOSED_REJECTED
    for origin in (S.PLANNING, S.EXECUTING):
        reason = close_reason_on_entry(origin, S.TIMEOUT, None)
        assert reason is not None
        assert final_state_for(reason) == S.CLOSED_FAILED


def test_every_close_reason_has_a_legal_exit_from_tracing() -> None:
    """K3: final_state_for is total over close reasons and only names legal TRACING exits."""
    for reason in CloseReason:
        assert (S.TRACING, final_state_for(reason)) in LEGAL


@pytest.mark.parametrize("state", list(RunState))
def test_projection_matches_seed_table(state: RunState) -> None:
    """K6: each state projects to the legacy status seed 000 §5.1 gives it."""
    assert job_status(state).value == EXPECTED_PROJECTION[state]


def test_projection_uses_only_the_four_legacy_values() -> None:
    """K6: Job.status is never extended beyond pending/running/done/failed."""
    assert {s.value for s in JobStatus} == {"pending", "running", "done", "failed"}
    assert {job_status(s) for s in RunState} == set(JobStatus)


def test_each_final_state_writes_its_own_reconciliation_event() -> None:
    """K8: entering each final state writes exactly one audit event, distinct per final state."""
    assert set(FINAL_EVENT) == FINAL
    assert len(set(FINAL_EVENT.values())) == len(FINAL)
    assert FINAL_EVENT[S.SUCCEEDED] == "run_succeeded"
    for final in FINAL:
        assert audit_events_for(S.TRACING, final) == (FINAL_EVENT[final],)
    for source, target in LEGAL:
        if target not in FINAL:
            assert not set(audit_events_for(source, target)) & set(FINAL_EVENT.values())


def test_keeps_close_reason_says_exactly_when_a_move_leaves_the_reason_as_it_was() -> None:
    """The one-statement compare-and-set leaves close_reason out of its UPDATE for these moves: for every
    legal move and every prior reason, "keeps" holds exactly when the move's reason is the prior one."""
    priors: list[CloseReason | None] = [None, *CloseReason]
    kept = 0
    for source in S:
        for target in targets_from(source):
            keeps = keeps_close_reason(source, target)
            if source == S.TRACING:
                assert not keeps  # TRACING's exit is checked against the reason, never written blind
                continue
            reasons = {prior: close_reason_on_entry(source, target, prior) for prior in priors}
            if keeps:
                assert all(reason == prior for prior, reason in reasons.items()), (source, target)
            else:  # the move sets a reason of its own, whatever the prior one was
                assert len(set(reasons.values())) == 1 and None not in reasons.values(), (source, target)
            kept += keeps
    assert kept > 5


def test_exit_reasons_are_exactly_the_reasons_whose_final_state_is_the_target() -> None:
    """The one-statement exit from TRACING matches the close reason against these."""
    for target in S:
        assert set(exit_reasons(target)) == {r for r in CloseReason if final_state_for(r) == target}
    assert exit_reasons(S.FAILED) == ()  # the sweeper's way out takes any reason and sets FAILED
    assert set(exit_reasons(S.CLOSED_REJECTED)) == {CloseReason.REJECTED, CloseReason.HITL_TIMEOUT}
