"""The child process of `migration.migrate_apart`: migrates the database named by HARNESS_MIGRATE_URL.

Each line it writes on stderr is `<logger>\t<message>`: the log records of the migration (alembic's step by
step), which the parent logs again as its own, and on failure a last `error\t<reason>` line, exit status 1.
"""

from __future__ import annotations

import logging
import os
import sys


class _Lines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().replace("\n", " ")
        sys.stderr.write(f"{record.name}\t{message}\n")


def main() -> int:
    from harness.adapters.sql.database import create_engine
    from harness.adapters.sql.migration import MIGRATE_URL_ENV, migrate

    url = os.environ.get(MIGRATE_URL_ENV)
    if not url:
        sys.stderr.write(f"error\t{MIGRATE_URL_ENV} names no database\n")
        return 1
    root = logging.getLogger()
    root.addHandler(_Lines())
    root.setLevel(logging.INFO)
    engine = create_engine(url)
    try:
        migrate(engine)
    except Exception as exc:  # the parent raises it as its own error, named
        first = str(exc).strip().splitlines()
        sys.stderr.write(f"error\t{type(exc).__name__}: {first[0] if first else ''}\n")
        return 1
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
