"""Where a skill's process runs: this host's sandbox, a sandbox server's, or a choice between them by tenant
and skill (the settings say which), the pool of kept instances, and `harness sandbox serve`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from harness.adapters.sandbox import select_sandbox
from harness.adapters.sandbox.instance import HolderProcesses
from harness.adapters.sandbox.providers import ProviderChoice
from harness.adapters.sql.sandbox_instances import InstanceTable
from harness.domain.errors import InvalidRequestError
from harness.pipeline.sandbox_pool import SandboxPool

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer
    from pathlib import Path

    from harness.adapters.sandbox.remote import RemoteSandbox
    from harness.adapters.sql.store import SqlStore
    from harness.domain.sandbox import PoolSettings
    from harness.ports import Sandbox
    from harness.ports.ledger import CostBook
    from harness.settings import Settings


def sandbox_provider(settings: Settings) -> Sandbox:
    """The sandbox of the settings: this host's (bubblewrap, or the rlimit fallback), a sandbox server's
    (HARNESS_SANDBOX_PROVIDER=remote, HARNESS_SANDBOX_URL, HARNESS_SANDBOX_TOKEN), or this host's with some
    tenants' or skills' calls sent to the server."""
    remote = remote_sandbox(settings)
    if remote is None:
        return select_sandbox(settings.sandbox)
    if settings.sandbox_provider == "remote":
        return remote
    return ProviderChoice(lambda: select_sandbox(settings.sandbox), remote,
                          remote_tenants=settings.sandbox_remote_tenants, remote_skills=settings.sandbox_remote_skills)


def remote_sandbox(settings: Settings) -> RemoteSandbox | None:
    """The sandbox server's client when the settings send some calls there (HARNESS_SANDBOX_PROVIDER=remote,
    or some tenants or skills), else None."""
    remote_some = settings.sandbox_remote_tenants or settings.sandbox_remote_skills
    if settings.sandbox_provider == "local" and not remote_some:
        return None
    if not settings.sandbox_url:
        raise InvalidRequestError("the remote sandbox provider needs HARNESS_SANDBOX_URL (the sandbox server's URL)")
    from harness.adapters.sandbox.remote import RemoteSandbox  # httpx, only when a remote provider is set

    return RemoteSandbox(settings.sandbox_url, os.environ.get("HARNESS_SANDBOX_TOKEN", ""))


def sandbox_server(settings: Settings, token: str, host: str, port: int,
                   data_dir: Path | None = None) -> ThreadingHTTPServer:
    """`harness sandbox serve`: this host's sandbox (by HARNESS_SANDBOX) over HTTP, accepting only `token`,
    keeping the code and the Runs' files it is sent under `data_dir` (default: the data directory's
    sandbox-server folder)."""
    from harness.adapters.sandbox.server import make_server
    from harness.adapters.sandbox.yard import Yard

    yard = Yard(data_dir if data_dir is not None else settings.data_dir / "sandbox-server")
    return make_server(select_sandbox(settings.sandbox), token, host, port, yard)


def sandbox_pool(store: SqlStore, pool: PoolSettings, *, owner: str, ledger: CostBook | None = None,
                 price_per_s: float = 0.0, price_table: str | None = None,
                 remote: RemoteSandbox | None = None) -> SandboxPool:
    """This host's sandbox pool over a store's instance table, with the processes of this host and, when
    some calls go to a sandbox server, those of its instances (asked of the server); a kept instance's
    seconds are booked to `ledger` (none: not booked)."""
    return SandboxPool(InstanceTable(store), HolderProcesses(), pool, owner=owner, ledger=ledger,
                       price_per_s=price_per_s, price_table=price_table,
                       providers={"remote": remote} if remote is not None else None)
