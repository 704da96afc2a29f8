"""The retention policy's settings and the Merkle multiproof that proves a whole segment at once."""

from __future__ import annotations

import random

import pytest

from harness.audit.merkle import MerkleTree, leaf_hash
from harness.audit.multiproof import multiproof, root_from
from harness.domain.errors import BadInputError
from harness.retention.policy import DAY_S, RetentionPolicy, parse_tenants


def test_the_policy_comes_from_the_environment() -> None:
    """Days by default and per tenant (`never` keeps a tenant forever); unset keeps everything."""
    policy = RetentionPolicy.from_env({"HARNESS_RETENTION_DAYS": "30", "HARNESS_RETENTION_TENANTS": "a=7, b=never",
                                       "HARNESS_ARCHIVE_BATCH": "500", "HARNESS_ARCHIVE_INTERVAL_S": "60"})
    assert (policy.days, policy.tenants, policy.batch, policy.interval_s) == (30, {"a": 7, "b": None}, 500, 60)
    default, tenants = policy.cutoffs(100 * DAY_S)
    assert default == 70 * DAY_S and tenants == {"a": 93 * DAY_S, "b": None}
    assert RetentionPolicy.from_env({}).days is None
    assert "b: forever" in policy.describe()


@pytest.mark.parametrize(("env", "named"), [
    ({"HARNESS_RETENTION_DAYS": "-1"}, "HARNESS_RETENTION_DAYS"),
    ({"HARNESS_RETENTION_DAYS": "nan"}, "HARNESS_RETENTION_DAYS"),
    ({"HARNESS_RETENTION_TENANTS": "=3"}, "tenant=days"),
    ({"HARNESS_ARCHIVE_BATCH": "0"}, "HARNESS_ARCHIVE_BATCH"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], named: str) -> None:
    """A wrong value is a BadInputError naming the setting."""
    with pytest.raises(BadInputError, match=named):
        RetentionPolicy.from_env(env)
    assert parse_tenants("") == {}


def test_a_multiproof_proves_exactly_the_leaves_it_was_made_for() -> None:
    """For any set of leaves, the proof gives the signed root; a hash short, one too many, a swapped or
    changed leaf, or another index does not."""
    rng = random.Random(7)
    tree = MerkleTree.from_leaves(leaf_hash(str(i).encode()) for i in range(300))
    for size in (1, 2, 3, 5, 64, 65, 299, 300):
        for _ in range(15):
            idx = sorted(rng.sample(range(size), rng.randint(1, size)))
            proof, leaves = multiproof(tree, idx, size), [tree.leaf(i) for i in idx]
            assert root_from(idx, leaves, size, proof) == tree.root(size)
            assert root_from(idx, leaves, size, [*proof, leaves[0]]) is None
            if proof:
                assert root_from(idx, leaves, size, proof[:-1]) is None
            changed = [leaf_hash(b"x"), *leaves[1:]]
            assert root_from(idx, changed, size, proof) != tree.root(size)
            if idx[-1] + 1 < size:
                moved = [*idx[:-1], idx[-1] + 1]
                assert root_from(moved, leaves, size, proof) != tree.root(size)
    assert len(multiproof(tree, list(range(100, 200)), 300)) <= 2 * 9
