"""RFC 9162 Merkle trees: tree heads, inclusion and consistency proofs, and their rejection when forged."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.audit.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    RootAccumulator,
    leaf_hash,
    node_hash,
    root_of,
    split_point,
    verify_consistency,
    verify_inclusion,
)

# The eight leaf inputs of the Certificate Transparency reference test vectors, and their published roots.
CT_INPUTS = [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
             bytes(range(0x50, 0x58)), bytes(range(0x60, 0x70))]
CT_ROOTS = {
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    3: "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    4: "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    5: "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    6: "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    7: "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    8: "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}


def reference_root(data: list[bytes]) -> bytes:
    """MTH exactly as RFC 9162 §2.1.1 defines it, recursively: the oracle for the fast tree."""
    if not data:
        return EMPTY_ROOT
    if len(data) == 1:
        return leaf_hash(data[0])
    k = split_point(len(data))
    return node_hash(reference_root(data[:k]), reference_root(data[k:]))


def leaves(n: int) -> list[bytes]:
    """n distinct leaf inputs."""
    return [i.to_bytes(4, "big") for i in range(n)]


def tree_of(data: list[bytes]) -> MerkleTree:
    """The fast tree over these inputs."""
    return MerkleTree.from_leaves(leaf_hash(d) for d in data)


# The seven-leaf example tree of RFC 6962 §2.1.3: a..f and d6 are leaves, g..l interior nodes.
D = leaves(7)
a, b, c, d, e, f = (leaf_hash(x) for x in D[:6])
d6 = leaf_hash(D[6])
g, h, i, j = node_hash(a, b), node_hash(c, d), node_hash(e, f), d6
k, l = node_hash(g, h), node_hash(i, j)  # noqa: E741 - the RFC's name for the node
ROOT7 = node_hash(k, l)


def test_leaf_and_node_hashes_are_domain_separated() -> None:
    """A leaf is H(0x00||data) and a node H(0x01||l||r), so a node can never pass for a leaf."""
    assert leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    assert node_hash(b"l" * 32, b"r" * 32) == hashlib.sha256(b"\x01" + b"l" * 32 + b"r" * 32).digest()
    assert leaf_hash(a + b) != node_hash(a, b)


def test_roots_match_the_certificate_transparency_vectors() -> None:
    """Tree heads of 1..8 leaves equal the published CT reference roots (and the empty tree is H(''))."""
    tree = tree_of(CT_INPUTS)
    assert tree.root(0) == EMPTY_ROOT == hashlib.sha256(b"").digest()
    for n, expected in CT_ROOTS.items():
        assert tree.root(n).hex() == expected
        assert root_of(leaf_hash(x) for x in CT_INPUTS[:n]).hex() == expected


def test_seven_leaf_tree_is_built_as_hand_computed() -> None:
    """The seven-leaf tree head is node(k, l) with the RFC's largest-power-of-two split."""
    assert tree_of(D).root() == ROOT7
    assert tree_of(D).root(3) == node_hash(g, c)


@pytest.mark.parametrize(("index", "path"), [(0, [b, h, l]), (3, [c, g, l]), (4, [f, j, k]), (6, [i, k])])
def test_inclusion_proofs_match_the_rfc_example(index: int, path: list[bytes]) -> None:
    """PATH(m, D[7]) lists the siblings deepest first, exactly as RFC 6962 §2.1.3 shows."""
    tree = tree_of(D)
    assert tree.inclusion_proof(index) == path
    assert verify_inclusion(leaf_hash(D[index]), index, 7, path, ROOT7)


@pytest.mark.parametrize(("old", "path"), [(3, [c, d, g, l]), (4, [l]), (6, [i, j, k])])
def test_consistency_proofs_match_the_rfc_example(old: int, path: list[bytes]) -> None:
    """PROOF(m, D[7]) for m = 3, 4, 6 is the node list of RFC 6962 §2.1.3."""
    tree = tree_of(D)
    assert tree.consistency_proof(old) == path
    assert verify_consistency(old, 7, tree.root(old), ROOT7, path)


def test_accumulator_gives_the_root_at_every_size() -> None:
    """The streaming accumulator's root after n appends equals the tree head of n leaves."""
    acc, data = RootAccumulator(), leaves(40)
    for n, x in enumerate(data, start=1):
        acc.append(leaf_hash(x))
        assert acc.root() == reference_root(data[:n])


def test_out_of_range_requests_are_refused() -> None:
    """Asking for a leaf or size the tree does not have is an error, not a wrong proof."""
    tree = tree_of(D)
    for call in (lambda: tree.inclusion_proof(7), lambda: tree.root(8), lambda: tree.consistency_proof(5, 4)):
        with pytest.raises(ValueError, match=r"tree|leaf|consistency"):
            call()
    with pytest.raises(ValueError, match="32 bytes"):
        tree.append(b"short")


def test_verifiers_reject_degenerate_inputs() -> None:
    """Index beyond the tree, shrinking trees, empty proofs between different trees and short hashes fail."""
    leaf = leaf_hash(D[0])
    assert not verify_inclusion(leaf, 7, 7, [b, h, l], ROOT7)
    assert not verify_inclusion(leaf, 0, 7, [b, h, l[:31]], ROOT7)
    assert not verify_inclusion(leaf, 0, 7, [b, h, l, l], ROOT7)
    assert not verify_consistency(7, 3, ROOT7, ROOT7, [])
    assert not verify_consistency(3, 7, node_hash(g, c), ROOT7, [])
    assert not verify_consistency(0, 7, EMPTY_ROOT, ROOT7, [l])
    assert verify_consistency(0, 7, EMPTY_ROOT, ROOT7, [])
    assert verify_consistency(7, 7, ROOT7, ROOT7, [])
    assert not verify_consistency(7, 7, ROOT7, k, [])


sizes = st.integers(min_value=1, max_value=200)


@settings(max_examples=100, deadline=None)
@given(sizes, st.data())
def test_every_inclusion_proof_verifies(n: int, data: st.DataObject) -> None:
    """For any tree size and leaf, the generated proof verifies and the root equals the RFC definition."""
    inputs = leaves(n)
    tree = tree_of(inputs)
    size = data.draw(st.integers(min_value=1, max_value=n))
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    root = reference_root(inputs[:size])
    assert tree.root(size) == root
    assert verify_inclusion(leaf_hash(inputs[index]), index, size, tree.inclusion_proof(index, size), root)


@settings(max_examples=100, deadline=None)
@given(sizes, st.data())
def test_tampered_inclusion_proofs_fail(n: int, data: st.DataObject) -> None:
    """A proof with a flipped bit, swapped siblings, a wrong index or another size's root never verifies.

    (The size itself is bound by the signed tree head, not by the proof: a proof for leaf 0 of 3 has the
    same shape as one for leaf 0 of 4, which is why checkpoints sign tree_size.)"""
    inputs = leaves(n)
    tree = tree_of(inputs)
    index = data.draw(st.integers(min_value=0, max_value=n - 1))
    proof, root, leaf = tree.inclusion_proof(index), tree.root(), leaf_hash(inputs[index])
    if n > 1:
        other = data.draw(st.integers(min_value=0, max_value=n - 1).filter(lambda x: x != index))
        assert not verify_inclusion(leaf, other, n, proof, root)
    if index < n - 1:
        assert not verify_inclusion(leaf, index, n, proof, tree.root(n - 1))
    if proof:
        at = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        flipped = list(proof)
        flipped[at] = bytes([proof[at][0] ^ 1]) + proof[at][1:]
        assert not verify_inclusion(leaf, index, n, flipped, root)
        assert not verify_inclusion(leaf, index, n, proof[:-1], root)
    if len(proof) > 1:
        swapped = list(proof)
        swapped[0], swapped[1] = swapped[1], swapped[0]
        assert not verify_inclusion(leaf, index, n, swapped, root)


@settings(max_examples=100, deadline=None)
@given(sizes, st.data())
def test_every_consistency_proof_verifies(n: int, data: st.DataObject) -> None:
    """For any 0 <= m <= n the generated consistency proof verifies between the two tree heads."""
    inputs = leaves(n)
    tree = tree_of(inputs)
    m = data.draw(st.integers(min_value=0, max_value=n))
    proof = tree.consistency_proof(m)
    assert verify_consistency(m, n, reference_root(inputs[:m]), reference_root(inputs), proof)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=200), st.data())
def test_consistency_fails_for_rewritten_or_tampered_history(n: int, data: st.DataObject) -> None:
    """Changing one old leaf, one proof node or the sizes makes the consistency proof fail."""
    inputs = leaves(n)
    tree = tree_of(inputs)
    m = data.draw(st.integers(min_value=1, max_value=n - 1))
    proof, old_root, new_root = tree.consistency_proof(m), tree.root(m), tree.root()
    victim = data.draw(st.integers(min_value=0, max_value=m - 1))
    rewritten = tree_of([b"forged" if x == victim else v for x, v in enumerate(inputs)])
    assert not verify_consistency(m, n, old_root, rewritten.root(), rewritten.consistency_proof(m))
    assert not verify_consistency(m, n, rewritten.root(m), new_root, proof)
    at = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
    flipped = list(proof)
    flipped[at] = bytes([proof[at][0] ^ 1]) + proof[at][1:]
    assert not verify_consistency(m, n, old_root, new_root, flipped)
    assert not verify_consistency(m, n, tree.root(m - 1) if m > 1 else EMPTY_ROOT, new_root, proof)


def test_a_large_tree_is_built_in_linear_time() -> None:
    """131,073 leaves build without recursion blow-ups and every sampled proof verifies."""
    hashes = [hashlib.sha256(x.to_bytes(8, "big")).digest() for x in range(131_073)]
    tree = MerkleTree.from_leaves(hashes)
    root = tree.root()
    assert root == root_of(hashes)
    for index in (0, 1, 65_535, 65_536, 131_072):
        assert verify_inclusion(hashes[index], index, 131_073, tree.inclusion_proof(index), root)
    assert verify_consistency(123_457, 131_073, tree.root(123_457), root, tree.consistency_proof(123_457))
