"""How a Run's RunContext is kept in its `runs.context` column.

PostgreSQL compresses a value of more than about 2 KB on its own (TOAST) and InnoDB moves a long one off
the row's page, but SQLite keeps the whole text in the row: a finished Run's ~2.2 KB context made its row
~3 KB, so one row took a 4 KB page of its own and a quarter of that page stayed empty. On SQLite a context
of at least `PACK_FROM` bytes is therefore stored as zlib-compressed canonical JSON (a BLOB; under half the
text), which lets two such rows share a page. A smaller one stays readable text.

Reading takes either form (a BLOB is a packed context, text is JSON), so a database written before
keeps working. The trace is never packed: its records are the audit's, read as they are written."""

from __future__ import annotations

import json
import zlib
from typing import Any

from harness.domain.chain import canonical_json
from harness.domain.errors import StoreError

#: contexts of at least this many bytes of canonical JSON are packed (on SQLite)
PACK_FROM = 1024
_LEVEL, _WINDOW_BITS, _MEM_LEVEL = 1, 12, 4


def encode_context(context: dict[str, Any], *, packs: bool) -> str | bytes:
    """What `runs.context` holds for `context`: its canonical JSON, packed where `packs`."""
    return pack(canonical_json(context), packs=packs)


def pack(text: str, *, packs: bool) -> str | bytes:
    """The stored form of a RunContext's canonical JSON `text`: compressed when `packs` (the backend
    keeps long text in its rows) and the text is long enough to gain from it."""
    if not packs:
        return text
    data = text.encode()
    if len(data) < PACK_FROM:
        return text
    # the fastest level, a 4 KB window and a small hash table: a context's repeats (keys, skill ids) lie
    # close together, and a 2 KB context packs to 46 % of its text this way against 44 % with zlib's
    # defaults, for three quarters of the work (it is packed at every write of the Run's context)
    packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WINDOW_BITS, _MEM_LEVEL)
    return packer.compress(data) + packer.flush()


def unpack(stored: str | bytes | memoryview | None, run_id: str = "") -> dict[str, Any] | None:
    """The RunContext a `runs.context` value holds (None for none). StoreError naming the Run when the
    value is neither a compressed context nor a JSON object (the row was changed outside harness)."""
    if stored is None or stored == "":
        return None
    try:
        context = json.loads(stored if isinstance(stored, str) else zlib.decompress(bytes(stored)))
    except (zlib.error, ValueError) as exc:
        form = "text" if isinstance(stored, str) else "compressed"
        raise StoreError(f"Run {run_id}'s stored context is damaged: its {form} form does not decode ({exc})") \
            from None
    if not isinstance(context, dict):
        raise StoreError(f"Run {run_id}'s stored context is damaged: it is not a JSON object")
    return context
