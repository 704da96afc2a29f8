"""Identifiers that sort by creation time (the UUID version 7 layout, RFC 9562).

Runs, trace records and audit events are keyed by ids that land in B-tree indexes. Random (version 4)
ids scatter every insert over the whole index, so each transaction dirties one page per index per row;
time-ordered ids append near the right edge, where the previous inserts already are. They remain
valid, unique UUIDs: 48 bits of Unix milliseconds, then 74 random bits.
"""

from __future__ import annotations

import os
import time


def ordered_id() -> str:
    """A new UUID (version 7): the creation millisecond first, then randomness."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 of them used
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # the RFC variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b, 62 bits
    h = f"{value:032x}"  # what str(uuid.UUID(int=value)) prints, without building the object
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
