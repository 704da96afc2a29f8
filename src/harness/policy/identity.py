"""The identity directory: which roles an authenticated identity holds (tenant/user -> roles)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.domain.contracts import IDENT, CallerIdentity
from harness.domain.errors import BadInputError
from harness.yamlfile import parse_yaml, read_text


class UnknownIdentityError(BadInputError):
    """The identity is not in the directory."""


class Entry(BaseModel):
    """One identity's roles, the teams (collaboration groups) it belongs to, and, for the HTTP API, the
    SHA-256 of its API key."""

    model_config = ConfigDict(extra="forbid")
    roles: list[str] = Field(default_factory=list)
    teams: list[Annotated[str, Field(pattern=IDENT)]] = Field(default_factory=list)
    api_key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class DirectoryFile(BaseModel):
    """The directory file."""

    model_config = ConfigDict(extra="forbid")
    identities: dict[str, Entry]


def split_identity(text: str, default_tenant: str = "default") -> tuple[str, str]:
    """("tenant", "user") from "tenant/user" or "user"."""
    tenant, _, user = text.rpartition("/")
    tenant = tenant or default_tenant
    for part, what in ((tenant, "tenant"), (user, "user")):
        if not re.match(IDENT, part):
            raise BadInputError(f"identity {text!r}: {what} {part!r} is not a valid name")
    return tenant, user


class IdentityDirectory:
    """Looks identities up by name."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        self._entries = entries

    @classmethod
    def from_file(cls, path: Path) -> IdentityDirectory:
        """Load a directory file; errors name the file and the field."""
        text = read_text(path, BadInputError, "identities")
        try:
            return cls(DirectoryFile.model_validate(parse_yaml(text)).identities)
        except (yaml.YAMLError, ValidationError) as exc:
            raise BadInputError(f"{path}: invalid identities file: {exc}") from exc

    def resolve(self, text: str, default_tenant: str = "default") -> CallerIdentity:
        """The identity named "tenant/user" (or "user" in the default tenant) with its roles."""
        tenant, user = split_identity(text, default_tenant)
        entry = self._entries.get(f"{tenant}/{user}")
        if entry is None:
            raise UnknownIdentityError(f"unknown identity {tenant}/{user}: not in the identity directory")
        return CallerIdentity(tenant_id=tenant, user_id=user, roles=tuple(entry.roles))

    def find(self, tenant: str, user: str) -> CallerIdentity | None:
        """The identity if the directory knows it."""
        entry = self._entries.get(f"{tenant}/{user}")
        return CallerIdentity(tenant_id=tenant, user_id=user, roles=tuple(entry.roles)) if entry else None

    def roles_of(self, tenant: str, user: str) -> tuple[str, ...]:
        """The identity's roles; none for an identity the directory does not know."""
        entry = self._entries.get(f"{tenant}/{user}")
        return tuple(entry.roles) if entry else ()

    def teams_of(self, tenant: str, user: str) -> tuple[str, ...]:
        """The teams the identity belongs to; none for an identity the directory does not know."""
        entry = self._entries.get(f"{tenant}/{user}")
        return tuple(entry.teams) if entry else ()

    def by_api_key_hash(self, digest: str) -> CallerIdentity | None:
        """The identity whose API key hashes to `digest`."""
        for name, entry in self._entries.items():
            if entry.api_key_sha256 is not None and entry.api_key_sha256 == digest:
                tenant, user = name.split("/", 1)
                return CallerIdentity(tenant_id=tenant, user_id=user, roles=tuple(entry.roles))
        return None
