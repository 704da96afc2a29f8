"""The memory store on SQLite (FTS5), PostgreSQL (full-text) and MariaDB (exact BM25) (SPEC C2, C5)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.context.errors import ScopeViolationError
from harness.context.secrets import SecretFilter
from harness.domain.records import NewRun
from harness.memory.scope import MemoryScope
from harness.memory.store import MemoryStore, NewMemory

FILTER = SecretFilter()
ALICE = MemoryScope("t1", "alice", "s1", "support")


@pytest.fixture
def memory(backend_url: str) -> Iterator[MemoryStore]:
    """A memory store on a fresh, migrated database of the backend under test."""
    store = SqlStore.open(backend_url, FakeClock())
    yield MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
    store.close()


def engine_of(memory: MemoryStore) -> sa.Engine:
    """The database under a memory store of these tests."""
    assert isinstance(memory.rows, SqlMemoryRows)
    return memory.rows.engine


def seed(memory: MemoryStore) -> None:
    """One refund note in every scope that alice can see, and in every one she cannot."""
    memory.add([
        NewMemory("t1", "tenant", "tenant policy: refunds over 100 EUR need a lead", entry_id="tenant"),
        NewMemory("t1", "team", "support team: refunds drafted first", team_id="support", entry_id="team"),
        NewMemory("t1", "user", "alice: refunds as store credit", user_id="alice", entry_id="user"),
        NewMemory("t1", "session", "alice this session: refund for A-1002", user_id="alice", session_id="s1",
                  entry_id="session"),
        NewMemory("t1", "team", "sales team: refunds need a quote", team_id="sales", entry_id="other-team"),
        NewMemory("t1", "user", "bob: refunds to card", user_id="bob", entry_id="other-user"),
        NewMemory("t1", "session", "alice other session: refund for A-9", user_id="alice", session_id="s2",
                  entry_id="other-session"),
        NewMemory("t2", "tenant", "tenant two: refunds never allowed", entry_id="other-tenant"),
        NewMemory("t2", "user", "alice of t2: refunds by cheque", user_id="alice", entry_id="t2-user"),
    ])


def test_recall_sees_exactly_the_callers_scopes(memory: MemoryStore) -> None:
    """Tenant-wide, own team, own user and own session entries are recalled; nothing of anyone else."""
    seed(memory)
    found = {r.entry_id for r in memory.recall(ALICE, "refunds", 20)}
    assert found == {"tenant", "team", "user", "session"}
    without_team = {r.entry_id for r in memory.recall(MemoryScope("t1", "alice", "s1"), "refunds", 20)}
    assert without_team == {"tenant", "user", "session"}


def test_lexical_recall_ranks_the_relevant_entry_first(memory: MemoryStore) -> None:
    """The entry sharing the most query words comes first, on every backend's lexical search."""
    memory.add([NewMemory("t1", "user", text, user_id="alice", entry_id=key) for key, text in (
        ("carrier", "Orders to Austria ship with DHL; the carrier tracking number arrives by email"),
        ("refund", "Refunds for damaged parcels are issued as store credit"),
        ("address", "Alice moved: the delivery address is now Vienna"),
    )])
    assert memory.recall(ALICE, "which carrier ships my orders to Austria", 3)[0].entry_id == "carrier"
    assert memory.recall(ALICE, "refund for a damaged parcel", 3)[0].entry_id == "refund"


def test_secrets_never_reach_the_memory_table(memory: MemoryStore) -> None:
    """Every write is scrubbed: the stored content holds placeholders, not the credential."""
    memory.add([NewMemory("t1", "user", "deploy with AKIAQ7CANARY4EXAMPLE1 please", user_id="alice",
                          entry_id="secret")])
    with engine_of(memory).connect() as conn:
        stored = conn.execute(sa.select(t.memory_entries.c.content)).scalar_one()
    assert "AKIAQ7CANARY4EXAMPLE1" not in stored and "[REDACTED:aws_key]" in stored


def test_writing_the_same_entry_twice_stores_it_once(memory: MemoryStore) -> None:
    """Entry ids make writes idempotent: a repeated write-back does not duplicate memory."""
    entry = NewMemory("t1", "user", "one fact", user_id="alice", entry_id="fact-1")
    memory.add([entry])
    memory.add([entry])
    with engine_of(memory).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.memory_entries)).scalar_one() == 1


def test_the_same_content_in_the_same_scope_is_stored_once(memory: MemoryStore) -> None:
    """A second entry with the content the scope already remembers is not stored: `add` answers with the
    existing entry's id. The same content in another scope is its own entry."""
    first = memory.add([NewMemory("t1", "user", "Order A-1001 shipped with DHL", user_id="alice", entry_id="a")])
    again = memory.add([NewMemory("t1", "user", "Order A-1001 shipped with DHL", user_id="alice", entry_id="b"),
                        NewMemory("t1", "user", "Order A-1001 shipped with DHL", user_id="alice", entry_id="c")])
    elsewhere = memory.add([NewMemory("t1", "user", "Order A-1001 shipped with DHL", user_id="bob", entry_id="d"),
                            NewMemory("t1", "tenant", "Order A-1001 shipped with DHL", entry_id="e")])
    assert (first, again, elsewhere) == (["a"], ["a", "a"], ["d", "e"])
    with engine_of(memory).connect() as conn:
        stored = set(conn.execute(sa.select(t.memory_entries.c.entry_id)).scalars())
    assert stored == {"a", "d", "e"}


def test_an_unrecallable_copy_does_not_swallow_a_new_entry(backend_url: str) -> None:
    """Content first written by a Run that never succeeded is never recalled, so the same content written
    again is stored in its own right rather than answered with the invisible copy."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run, _ = store.create_run(NewRun("t1", "alice", "s1", {"task": "x"}))
        memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
        memory.add([NewMemory("t1", "user", "refund by card", user_id="alice", source_run_id=run.run_id,
                              entry_id="pending")])
        assert memory.add([NewMemory("t1", "user", "refund by card", user_id="alice", entry_id="manual")]) == [
            "manual"]
        assert [r.entry_id for r in memory.recall(ALICE, "refund card", 5)] == ["manual"]
    finally:
        store.close()


def test_recall_returns_each_content_once(memory: MemoryStore) -> None:
    """Copies stored before write-back deduplicated (here written straight to the table) are recalled once,
    and the next distinct entries fill the k places."""
    row = {"tenant_id": "t1", "scope": "user", "team_id": None, "user_id": "alice", "session_id": None,
           "kind": "note", "content": "refund for A-1001 issued", "content_hash": "x", "source_run_id": None,
           "created_at": 0.0, "embedding": None, "embedding_model": None}
    with engine_of(memory).begin() as conn:
        conn.execute(t.memory_entries.insert(), [{**row, "entry_id": f"copy{i}"} for i in range(5)])
    memory.add([NewMemory("t1", "user", "refund for A-1002 refused", user_id="alice", entry_id="other")])
    found = memory.recall(ALICE, "refund", 2)
    assert sorted(r.content for r in found) == ["refund for A-1001 issued", "refund for A-1002 refused"]


def test_entries_of_a_run_count_only_once_it_succeeded(backend_url: str) -> None:
    """An entry whose source Run is not SUCCEEDED (crash between write-back and close) is never recalled."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run, _ = store.create_run(NewRun("t1", "alice", "s1", {"task": "x"}))
        memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
        memory.add([NewMemory("t1", "user", "refund written by an unfinished run", user_id="alice",
                              source_run_id=run.run_id, entry_id="pending"),
                    NewMemory("t1", "user", "refund written by hand", user_id="alice", entry_id="manual")])
        assert [r.entry_id for r in memory.recall(ALICE, "refund", 5)] == ["manual"]
    finally:
        store.close()


def test_forgetting_a_user_removes_their_memory_only(memory: MemoryStore) -> None:
    """Deleting alice's memory leaves the tenant's and bob's entries in place."""
    seed(memory)
    assert memory.forget_user("t1", "alice") == 3
    assert {r.entry_id for r in memory.recall(ALICE, "refunds", 20)} == {"tenant", "team"}


def test_a_row_from_another_scope_is_a_hard_failure() -> None:
    """The row check refuses a foreign row (a query bug or a tampered row) instead of filtering it out."""
    foreign = SimpleNamespace(entry_id="x", tenant_id="t2", scope="tenant", team_id=None, user_id=None,
                              session_id=None)
    other_user = SimpleNamespace(entry_id="y", tenant_id="t1", scope="user", team_id=None, user_id="bob",
                                 session_id=None)
    for row in (foreign, other_user):
        with pytest.raises(ScopeViolationError, match="refused"):
            ALICE.check([row])


def test_a_ranked_row_names_the_columns_the_full_text_reads_select() -> None:
    """The full-text reads run on the DBAPI cursor and name their columns by position: the row type
    follows the statement's columns, then the rank."""
    from harness.adapters.sql.memory import Ranked, _columns

    assert list(Ranked._fields) == [c.key for c in _columns()] + ["rank"]


def test_the_best_entries_that_count_are_recalled_past_many_better_ones_that_do_not(backend_url: str) -> None:
    """Many entries of a Run that has not succeeded rank above the two that count (they match more of the
    query): recall still returns exactly the best two that count, however many it ranks first to find
    them (PostgreSQL ranks a few, then asks of those whether they count, then ranks more)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run, _ = store.create_run(NewRun("t1", "alice", "s1", {"task": "x"}))
        memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
        memory.add([NewMemory("t1", "user", f"refund refund by card for order A-{i} refund", user_id="alice",
                              source_run_id=run.run_id, entry_id=f"pending-{i}") for i in range(70)])
        memory.add([NewMemory("t1", "user", "refund by card", user_id="alice", entry_id="best"),
                    NewMemory("t1", "user", "a refund was asked", user_id="alice", entry_id="second"),
                    NewMemory("t1", "user", "a refund by post", user_id="alice", entry_id="third"),
                    NewMemory("t1", "user", "nothing about money", user_id="alice", entry_id="unrelated")])
        found = [r.entry_id for r in memory.recall(ALICE, "refund card", 2)]
        assert found[0] == "best" and len(found) == 2 and found[1] in ("second", "third")
        assert {r.entry_id for r in memory.recall(ALICE, "refund card", 10)} == {"best", "second", "third"}
    finally:
        store.close()


def test_a_recall_ranks_a_bounded_window_of_the_newest_entries(backend_url: str) -> None:
    """A recall ranks the scope's newest `recall_window` entries (those of them that share a word with the
    query), so its cost does not grow with every summary written back: an old entry that matches best is
    out of a small window and in a wide one; another scope's entries take no place in the window."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        def recalled(window: int, scope: MemoryScope = ALICE) -> list[str]:
            memory = MemoryStore(SqlMemoryRows(store.engine, recall_window=window), store.clock, FILTER)
            return [r.entry_id for r in memory.recall(scope, "refund card", 1)]

        writer = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
        writer.add([NewMemory("t1", "user", "refund by card", user_id="alice", entry_id="old-best")])
        writer.add([NewMemory("t1", "user", f"a refund for order A-{i}", user_id="alice", entry_id=f"new-{i}")
                    for i in range(30)])
        writer.add([NewMemory("t1", "user", f"bob asked about order B-{i}", user_id="bob", entry_id=f"bob-{i}")
                    for i in range(30)])
        assert recalled(1000) == ["old-best"]
        assert recalled(31) == ["old-best"]  # bob's 30 newer entries are not alice's to count
        narrow = recalled(10)  # the best of alice's ten newest
        assert len(narrow) == 1 and narrow[0].startswith("new-")
        assert recalled(10, MemoryScope("t1", "bob", "s9")) == []  # none of bob's shares a word
    finally:
        store.close()


def test_the_recall_window_is_a_setting_with_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_MEMORY_RECALL_WINDOW sets it (default 1,000); a value out of bounds is refused by name."""
    from harness.domain.errors import InvalidRequestError
    from harness.settings import Settings

    assert Settings.from_env().memory_recall_window == 1000
    monkeypatch.setenv("HARNESS_MEMORY_RECALL_WINDOW", "250")
    assert Settings.from_env().memory_recall_window == 250
    monkeypatch.setenv("HARNESS_MEMORY_RECALL_WINDOW", "3")
    with pytest.raises(InvalidRequestError, match="memory_recall_window"):
        Settings.from_env()


def _reads_texts(statement: str) -> bool:
    """Whether `statement` is the read of entries' texts to count (their ids and contents, nothing else)."""
    return statement.split("FROM", maxsplit=1)[0].split() == ["SELECT", "memory_entries.id,", "memory_entries.content"]


def _ranked_rows(conn: sa.Connection, scope: MemoryScope, query: str, k: int) -> list[tuple[str, float]]:
    from harness.adapters.sql.memory import _ranked_here, scope_params
    from harness.adapters.sql.raw import statements_for
    from harness.memory.lexical import terms

    params = {**scope_params(scope), "p_window_skip": 999}
    return [(r.entry_id, round(s, 9)) for r, s in _ranked_here(conn, statements_for(conn.dialect), terms(query),
                                                              scope, params, k)]


def test_the_python_ranking_reads_each_text_once_and_ranks_as_bm25_over_the_rows(backend_url: str) -> None:
    """The BM25 in Python (what MySQL/MariaDB recall with; any backend can run it): its scores are those of
    BM25 over the scope's rows as read whole; a text it has counted is not read again (the second recall reads
    no content), and a window listed in one GROUP_CONCAT (MySQL/MariaDB) ranks as one read row by row."""
    import random
    import string

    from harness.memory.lexical import bm25, terms

    store = SqlStore.open(backend_url, FakeClock())
    try:
        writer = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
        # texts no earlier test counted in this process (letters only: hex would be redacted as a secret)
        tag = "".join(random.choice(string.ascii_lowercase) for _ in range(12))
        seed(writer)
        writer.add([NewMemory("t1", "user", f"refund {tag} number {i} for {'card ' * (i % 4)}order A-{i}",
                              user_id="alice", entry_id=f"e{i}") for i in range(40)])
        read: list[str] = []

        def log(_conn: object, _cursor: object, statement: str, *_: object) -> None:
            read.append(statement)

        sa.event.listen(store.engine, "before_cursor_execute", log)
        with store.engine.connect() as conn:
            first = _ranked_rows(conn, ALICE, "refund card order", 8)
            texts_first = [s for s in read if _reads_texts(s)]
            read.clear()
            second = _ranked_rows(conn, ALICE, "refund card order", 8)
            texts_second = [s for s in read if _reads_texts(s)]
            whole = conn.execute(sa.text(
                "SELECT entry_id, content FROM memory_entries WHERE tenant_id = 't1' AND (scope = 'tenant' OR "
                "(scope = 'user' AND user_id = 'alice') OR (scope = 'session' AND user_id = 'alice' AND "
                "session_id = 's1') OR (scope = 'team' AND team_id = 'support')) ORDER BY id")).all()
            if conn.dialect.name in ("mysql", "mariadb"):  # the list cut short: read row by row instead
                conn.execute(sa.text("SET SESSION group_concat_max_len = 100"))
                row_by_row = _ranked_rows(conn, ALICE, "refund card order", 8)
                conn.execute(sa.text("SET SESSION group_concat_max_len = 4194304"))
                assert row_by_row == first
        sa.event.remove(store.engine, "before_cursor_execute", log)
        assert len(texts_first) == 1 and texts_second == [], (read, texts_first)
        expected = [(r.entry_id, round(s, 9)) for r, s in bm25(terms("refund card order"), whole, 8)]
        assert first == second == expected
        assert first[0][0].startswith("e") and {e for e, _ in first} <= {r.entry_id for r in whole}
    finally:
        store.close()
