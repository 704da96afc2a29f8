"""Authentication (SPEC U2): an API key, or a console session cookie, resolves to one identity.

The identity directory stores only the SHA-256 of each key. A request names its key in
`Authorization: Bearer <key>` or `X-API-Key: <key>`; the console exchanges the key once for a signed,
HttpOnly session cookie that carries the key's hash (so removing the key from the directory ends the
session too). Tenant, user and roles always come from the directory, never from a request body.
Cookie-authenticated writes must also carry the page's CSRF token (double submit, `X-CSRF-Token`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from harness.domain.authority import OPERATOR_ROLES
from harness.domain.contracts import CallerIdentity
from harness.policy.identity import IdentityDirectory
from harness.service.errors import ApiError

SESSION_COOKIE = "harness_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="Your API key.")
bearer_header = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`.")


def hash_key(key: str) -> str:
    """The SHA-256 hex digest the identity directory stores for an API key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling, as their credential proves."""

    identity: CallerIdentity
    key_hash: str
    via: str

    @property
    def tenant_id(self) -> str:
        """The caller's tenant: every query is filtered by it."""
        return self.identity.tenant_id

    @property
    def name(self) -> str:
        """ "tenant/user", as audit records name people."""
        return f"{self.identity.tenant_id}/{self.identity.user_id}"

    def has_any(self, roles: frozenset[str]) -> bool:
        """True when the caller holds at least one of `roles`."""
        return bool(roles & set(self.identity.roles))


class SessionSigner:
    """Issues and checks console session tokens: `<key hash>.<expiry>.<HMAC>`."""

    def __init__(self, secret: str, ttl_s: float, now: Callable[[], float] = time.time) -> None:
        self._secret = secret.encode("utf-8")
        self._ttl = ttl_s
        self._now = now

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def issue(self, key_hash: str) -> str:
        """A token for the identity holding the key with this hash."""
        payload = f"{key_hash}.{int(self._now() + self._ttl)}"
        return f"{payload}.{self._sign(payload)}"

    def verify(self, token: str) -> str | None:
        """The key hash inside a genuine, unexpired token; None otherwise."""
        parts = token.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        payload = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._sign(payload), parts[2]) or int(parts[1]) < self._now():
            return None
        return parts[0]

    def csrf_token(self, token: str) -> str:
        """The CSRF token that goes with a session token (embedded in the console's pages)."""
        return self._sign(f"csrf:{token}")


class Authenticator:
    """Resolves credentials to principals through the identity directory."""

    def __init__(self, directory: IdentityDirectory, signer: SessionSigner) -> None:
        self.directory = directory
        self.signer = signer

    def from_key(self, key: str) -> Principal | None:
        """The principal holding this API key, or None."""
        digest = hash_key(key)
        identity = self.directory.by_api_key_hash(digest)
        return Principal(identity, digest, "api_key") if identity else None

    def from_session(self, token: str) -> Principal | None:
        """The principal of a valid session token, or None."""
        digest = self.signer.verify(token)
        identity = self.directory.by_api_key_hash(digest) if digest else None
        return Principal(identity, digest, "session") if identity and digest else None


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="harness"'})


def authenticator_of(request: Request) -> Authenticator:
    """The service's authenticator."""
    auth: Authenticator = request.app.state.service.auth
    return auth


def session_principal(request: Request) -> Principal | None:
    """The console session's principal, or None (no CSRF check: for pages, which only read)."""
    token = request.cookies.get(SESSION_COOKIE)
    return authenticator_of(request).from_session(token) if token else None


def principal(
    request: Request,
    api_key: Annotated[str | None, Security(api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_header)],
) -> Principal:
    """The authenticated caller of an API request; 401 when the credential is missing or wrong."""
    auth = authenticator_of(request)
    raw_authorization = request.headers.get("authorization")
    if raw_authorization is not None and bearer is None:
        raise _unauthorized("the Authorization header must be 'Bearer <API key>'")
    key = api_key if api_key is not None else (bearer.credentials if bearer else None)
    if key is not None:
        found = auth.from_key(key)
        if found is None:
            raise _unauthorized("the API key is not valid")
        return found
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        session = auth.from_session(token)
        if session is None:
            raise _unauthorized("the console session has expired; sign in again")
        if request.method not in SAFE_METHODS and not hmac.compare_digest(
            request.headers.get(CSRF_HEADER, ""), auth.signer.csrf_token(token)
        ):
            raise ApiError(403, "csrf", "a console write must carry the page's X-CSRF-Token header")
        return session
    raise _unauthorized(
        "missing credentials: send 'Authorization: Bearer <API key>' or 'X-API-Key: <API key>'"
    )


def operator(caller: Annotated[Principal, Security(principal)]) -> Principal:
    """An authenticated caller holding an operator or auditor role; 403 otherwise."""
    if not caller.has_any(OPERATOR_ROLES):
        raise ApiError(403, "forbidden", f"this needs one of the roles {sorted(OPERATOR_ROLES)}")
    return caller
