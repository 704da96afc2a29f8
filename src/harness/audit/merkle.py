"""RFC 9162 (Certificate Transparency v2, ex RFC 6962) Merkle trees over SHA-256. Pure, no I/O.

Domain separation: a leaf hashes as H(0x00 || data) and an interior node as H(0x01 || left || right),
so a leaf can never be passed off as a node. The tree head of n leaves is MTH(D[0:n]), split at the
largest power of two below n. The leaf data of the audit trail are the records' canonical bytes
(harness.domain.chain.record_bytes), leaf index = seq - 1.

`MerkleTree` keeps every complete subtree hash in one flat buffer per level (2n hashes, 32 bytes each,
no per-node objects), so a million leaves cost about 64 MB and every proof costs O(log n) lookups.
`RootAccumulator` keeps only O(log n) hashes and gives the root at any size while streaming.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
#: the tree head of the empty tree: the hash of the empty string (RFC 9162 §2.1.1)
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """MTH of a single leaf: H(0x00 || data)."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An interior node: H(0x01 || left || right)."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def split_point(size: int) -> int:
    """The largest power of two strictly smaller than `size` (size >= 2)."""
    return 1 << ((size - 1).bit_length() - 1)


class RootAccumulator:
    """The tree head of a growing list of leaves, in O(log n) memory (a "compact range")."""

    def __init__(self) -> None:
        self.size = 0
        # roots of the complete subtrees that make up the tree so far, biggest (leftmost) first
        self._stack: list[bytes] = []

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash."""
        self._stack.append(leaf)
        self.size += 1
        # each trailing one-bit of the new size is a pair of equal subtrees that now merges
        n = self.size
        while n & 1 == 0:
            right = self._stack.pop()
            self._stack.append(node_hash(self._stack.pop(), right))
            n >>= 1

    def root(self) -> bytes:
        """MTH of the leaves appended so far."""
        if not self._stack:
            return EMPTY_ROOT
        acc = self._stack[-1]
        for left in reversed(self._stack[:-1]):
            acc = node_hash(left, acc)
        return acc


def root_of(leaves: Iterable[bytes]) -> bytes:
    """MTH of a sequence of leaf hashes, in one pass."""
    acc = RootAccumulator()
    for leaf in leaves:
        acc.append(leaf)
    return acc.root()


class MerkleTree:
    """Every complete subtree of a list of leaf hashes; tree heads and proofs for any size up to n."""

    def __init__(self) -> None:
        # _levels[j] holds the hashes of complete subtrees of 2**j leaves, left to right
        self._levels: list[bytearray] = [bytearray()]
        self.size = 0

    @classmethod
    def from_leaves(cls, leaves: Iterable[bytes]) -> MerkleTree:
        """A tree over these leaf hashes (already domain-separated with leaf_hash)."""
        tree = cls()
        for leaf in leaves:
            tree.append(leaf)
        return tree

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash, completing the subtrees it closes."""
        if len(leaf) != HASH_SIZE:
            raise ValueError(f"a leaf hash is {HASH_SIZE} bytes, not {len(leaf)}")
        self._levels[0] += leaf
        self.size += 1
        level, count = 0, self.size
        while count & 1 == 0:
            # the last two hashes of the level, already adjacent: left || right
            node = hashlib.sha256(NODE_PREFIX + self._levels[level][-2 * HASH_SIZE :]).digest()
            if len(self._levels) == level + 1:
                self._levels.append(bytearray())
            self._levels[level + 1] += node
            level, count = level + 1, count >> 1

    def leaf(self, index: int) -> bytes:
        """The leaf hash at `index`."""
        if not 0 <= index < self.size:
            raise ValueError(f"no leaf {index} in a tree of {self.size} leaves")
        return self._complete(0, index)

    def _complete(self, level: int, index: int) -> bytes:
        start = index * HASH_SIZE
        return bytes(self._levels[level][start : start + HASH_SIZE])

    def subtree(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]); O(log n) when lo is aligned as in every RFC proof."""
        if not 0 <= lo < hi <= self.size:
            raise ValueError(f"no subtree [{lo}, {hi}) in a tree of {self.size} leaves")
        width = hi - lo
        if width & (width - 1) == 0 and lo % width == 0:
            return self._complete(width.bit_length() - 1, lo // width)
        k = split_point(width)
        return node_hash(self.subtree(lo, lo + k), self.subtree(lo + k, hi))

    def root(self, size: int | None = None) -> bytes:
        """The tree head of the first `size` leaves (default: all)."""
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise ValueError(f"tree size {size} is outside 0..{self.size}")
        return EMPTY_ROOT if size == 0 else self.subtree(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """PATH(index, D[0:size]) of RFC 9162 §2.1.3.1, deepest sibling first."""
        size = self.size if size is None else size
        if not 0 <= index < size <= self.size:
            raise ValueError(f"no leaf {index} in a tree of {size} leaves (built: {self.size})")
        path: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            mid = lo + split_point(hi - lo)
            if index < mid:
                path.append(self.subtree(mid, hi))
                hi = mid
            else:
                path.append(self.subtree(lo, mid))
                lo = mid
        path.reverse()
        return path

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """PROOF(old_size, D[0:new_size]) of RFC 9162 §2.1.4.1 (empty when old is 0 or equal)."""
        new_size = self.size if new_size is None else new_size
        if not 0 <= old_size <= new_size <= self.size:
            raise ValueError(f"no consistency proof from {old_size} to {new_size} (built: {self.size})")
        if old_size in (0, new_size):
            return []
        path: list[bytes] = []
        lo, hi, m, complete = 0, new_size, old_size, True
        while m != hi - lo:
            k = split_point(hi - lo)
            if m <= k:
                path.append(self.subtree(lo + k, hi))
                hi = lo + k
            else:
                path.append(self.subtree(lo, lo + k))
                lo, m, complete = lo + k, m - k, False
        if not complete:
            path.append(self.subtree(lo, hi))
        path.reverse()
        return path


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: does `proof` show leaf hash `leaf` at `index` in the tree `root` of `size`?"""
    if not 0 <= index < size or any(len(p) != HASH_SIZE for p in proof):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn & 1 == 0 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: is the tree (`new_size`, `new_root`) an append-only extension of the old one?"""
    if not 0 <= old_size <= new_size or any(len(p) != HASH_SIZE for p in proof):
        return False
    if old_size == 0:
        # every tree extends the empty tree; a non-empty proof here is malformed
        return not proof
    if old_size == new_size:
        return not proof and old_root == new_root
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn & 1 == 0 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == new_root
