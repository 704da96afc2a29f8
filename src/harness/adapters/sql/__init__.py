"""The SQL adapters (SQLite, PostgreSQL, MariaDB/MySQL over SQLAlchemy 2).

The Run store with its trace chain and leases, blobs, the cost ledger, approvals, memory, webhooks and
retention. Only this package and harness.migrations import SQLAlchemy.
"""
