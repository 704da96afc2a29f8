"""Whether this database's history is a prefix of what a witness keeps (SPEC A3b).

A witness that holds a bigger tree than the publisher's is not proof that it kept the publisher's
checkpoint: a forked copy of the database may have published first, or the database may have been
restored from an older snapshot. So before a publisher calls a checkpoint witnessed it proves, with an
RFC 9162 consistency proof from its own tree to the witness's newest tree head, that its history is a
prefix of the witness's. It can build that proof only when its database holds the witness's records (a
replica that published a moment earlier); otherwise the histories have parted, and the witness's
checkpoints (their signed leaf-hash prefixes) tell which way:

- a fork: a record this database holds differs from the witness's record at the same place;
- a rollback: every record this database holds is the witness's, and the witness holds more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.audit import merkle
from harness.audit.formats import LEAF_PREFIX_BYTES, FormatError, leaf_prefixes
from harness.audit.witness import Witness, WitnessError, verified_docs

FORK = "fork"
ROLLBACK = "rollback"


class HistoryDivergedError(WitnessError):
    """This database's history is no prefix of the witness's: `kind` is FORK or ROLLBACK."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def prove_prefix(witness: Witness, database_id: str, tree: merkle.MerkleTree,
                 grow: Callable[[], merkle.MerkleTree]) -> merkle.MerkleTree:
    """The tree to sign: `tree` when it extends the witness's newest tree head, or `grow()` (the
    database's tree now) when the witness is ahead and a consistency proof from `tree` shows the witness's
    head extends it. HistoryDivergedError when neither holds; WitnessError when the witness cannot be read."""
    latest = witness.latest(database_id)
    if latest is None:
        return tree
    size, root = int(latest["tree_size"]), bytes.fromhex(str(latest["root_hash"]))
    if size <= tree.size:
        if tree.root(size) != root:
            raise diverged(witness, database_id, tree, latest)
        return tree
    grown = grow()
    if grown.size >= size:
        proof = grown.consistency_proof(tree.size, size)
        if merkle.verify_consistency(tree.size, size, tree.root(), root, proof):
            return grown
    raise diverged(witness, database_id, grown if grown.size >= tree.size else tree, latest)


def diverged(witness: Witness, database_id: str, tree: merkle.MerkleTree,
             latest: dict[str, Any]) -> HistoryDivergedError:
    """Why `tree` is no prefix of the witness's history, read from the checkpoints it keeps."""
    try:
        docs = verified_docs(witness, database_id)
    except WitnessError:
        docs = [latest]
    held = int(latest["tree_size"])
    first, checked = _first_difference(tree, docs)
    lead = f"witness {witness.name} keeps a history of {held} records and this database's {tree.size}"
    if first is not None:
        return HistoryDivergedError(FORK, f"{lead} forked from it at record {first + 1}, which differs from the "
                                          "witness's: a copy of this database published first, or this one was "
                                          "restored from a snapshot and went on with other records")
    if held > tree.size and checked >= tree.size:
        return HistoryDivergedError(ROLLBACK, f"{lead} are the start of it: this database was rolled back (restored "
                                              f"from an older snapshot, or records deleted); records "
                                              f"{tree.size + 1}..{held} the witness keeps are gone")
    return HistoryDivergedError(FORK, f"{lead} are no prefix of one another: the history forked (the witness's "
                                      "checkpoints sign no per-record digests to name the record)")


def _first_difference(tree: merkle.MerkleTree, docs: list[dict[str, Any]]) -> tuple[int | None, int]:
    """The first leaf of `tree` that differs from a leaf prefix the witness's checkpoints sign, if any;
    and how many leaves from the start the checkpoints vouch for (-1: a root they sign at a size the tree
    reaches differs from the tree's)."""
    first: int | None = None
    agreed, root_differs = 0, False
    covered: list[tuple[int, int]] = []
    for doc in docs:
        size = int(doc["tree_size"])
        if size <= tree.size:
            same = tree.root(size).hex() == doc["root_hash"]
            agreed, root_differs = (max(agreed, size), root_differs) if same else (agreed, True)
        try:
            signed = leaf_prefixes(doc)
        except FormatError:
            signed = None
        if signed is None:
            continue
        start, data = signed
        end = min(tree.size, start + len(data) // LEAF_PREFIX_BYTES)
        for index in range(start, end):
            offset = (index - start) * LEAF_PREFIX_BYTES
            if tree.leaf(index)[:LEAF_PREFIX_BYTES] != data[offset : offset + LEAF_PREFIX_BYTES]:
                first = index if first is None else min(first, index)
                break
        covered.append((start, end))
    return first, -1 if root_differs else _reach(agreed, covered)


def _reach(agreed: int, covered: list[tuple[int, int]]) -> int:
    """How far from leaf 0 the leaves are vouched for: up to a matching root, then by adjacent prefix ranges."""
    reach = agreed
    for start, end in sorted(covered):
        if start <= reach:
            reach = max(reach, end)
    return reach
