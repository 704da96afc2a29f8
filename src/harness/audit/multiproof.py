"""One proof for many leaves of an RFC 9162 Merkle tree. Pure, no I/O.

An archive segment proves tens of thousands of records against one signed tree head. A separate
inclusion proof per record costs log2(n) hashes each (about 600 bytes at a million records); a
multiproof carries, once, the root of every maximal subtree that holds none of the proven leaves, in a
fixed left-to-right order of the RFC's recursive split. The verifier recomputes the root from the proven
leaves and those hashes; it holds only when every leaf is at its index and the proof has no hash too
many or too few. For a run of k neighbouring leaves it is about 2·log2(n) hashes, whatever k is.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import pairwise

from harness.audit.merkle import MerkleTree, node_hash, split_point


def _check(indices: Sequence[int], size: int) -> None:
    if any(b <= a for a, b in pairwise(indices)):
        raise ValueError("leaf indices must be strictly increasing")
    if indices and not 0 <= indices[0] <= indices[-1] < size:
        raise ValueError(f"leaf indices must lie in 0..{size - 1}")


def multiproof(tree: MerkleTree, indices: Sequence[int], size: int) -> list[bytes]:
    """The hashes that, with the leaves at `indices` (sorted), give the root of the first `size` leaves."""
    _check(indices, size)
    out: list[bytes] = []

    def go(lo: int, hi: int, i: int, j: int) -> None:
        if i == j:
            out.append(tree.subtree(lo, hi))
        elif hi - lo > 1:
            mid = lo + split_point(hi - lo)
            m = bisect_left(indices, mid, i, j)
            go(lo, mid, i, m)
            go(mid, hi, m, j)

    if size:
        go(0, size, 0, len(indices))
    return out


def root_from(indices: Sequence[int], leaves: Sequence[bytes], size: int, proof: Sequence[bytes]) -> bytes | None:
    """The root that the leaves (leaf hashes at `indices`, sorted) and `proof` give for a tree of `size`
    leaves; None when the proof is malformed (too short, too long, or for other indices)."""
    try:
        _check(indices, size)
    except ValueError:
        return None
    if len(leaves) != len(indices) or size == 0 or not indices:
        return None
    hashes: Iterator[bytes] = iter(proof)

    def go(lo: int, hi: int, i: int, j: int) -> bytes:
        if i == j:
            return next(hashes)
        if hi - lo == 1:
            return leaves[i]
        mid = lo + split_point(hi - lo)
        m = bisect_left(indices, mid, i, j)
        return node_hash(go(lo, mid, i, m), go(mid, hi, m, j))

    try:
        root = go(0, size, 0, len(indices))
    except StopIteration:
        return None
    return None if next(hashes, None) is not None else root
