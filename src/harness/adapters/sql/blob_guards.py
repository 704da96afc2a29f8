"""The blobs table's append-only guards, with one audited door: an erasure (migration 0019).

A blob is content a trace record references by hash (harness.adapters.sql.blobs). An erasure request
deletes the contents only the person's Runs reference: inside its transaction it names each such hash in
`blob_grants`, deletes the blobs and removes the grants, so outside it no grant exists and DELETE stays
refused as before. UPDATE and TRUNCATE stay refused.
"""

from __future__ import annotations

_MESSAGE = "blobs is append-only"
_GRANTED = "EXISTS (SELECT 1 FROM blob_grants g WHERE g.hash = OLD.hash)"


def erasable_blobs_ddl(dialect: str) -> list[str]:
    """Statements that let a granted blob be deleted; everything else stays refused."""
    if dialect == "sqlite":
        return ["DROP TRIGGER IF EXISTS blobs_no_delete",
                f"CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs WHEN NOT {_GRANTED} "
                f"BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"]
    if dialect == "postgresql":
        return ["CREATE OR REPLACE FUNCTION blobs_append_only() RETURNS trigger AS $$ BEGIN "
                f"IF TG_OP = 'DELETE' THEN IF {_GRANTED} THEN RETURN OLD; END IF; END IF; "
                f"RAISE EXCEPTION '{_MESSAGE}'; END; $$ LANGUAGE plpgsql"]
    if dialect in ("mysql", "mariadb"):
        return ["DROP TRIGGER IF EXISTS blobs_no_delete",
                "CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs FOR EACH ROW "
                f"BEGIN IF NOT {_GRANTED} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{_MESSAGE}'; END IF; END"]
    raise NotImplementedError(f"no blob guards for dialect {dialect}")


def plain_blobs_ddl(dialect: str) -> list[str]:
    """Statements that restore the DELETE guard without a door (the downgrade of 0019)."""
    if dialect == "sqlite":
        return ["DROP TRIGGER IF EXISTS blobs_no_delete",
                f"CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"]
    if dialect == "postgresql":
        return ["CREATE OR REPLACE FUNCTION blobs_append_only() RETURNS trigger AS $$ "
                f"BEGIN RAISE EXCEPTION '{_MESSAGE}'; END; $$ LANGUAGE plpgsql"]
    if dialect in ("mysql", "mariadb"):
        return ["DROP TRIGGER IF EXISTS blobs_no_delete",
                "CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs FOR EACH ROW "
                f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{_MESSAGE}'"]
    raise NotImplementedError(f"no blob guards for dialect {dialect}")
