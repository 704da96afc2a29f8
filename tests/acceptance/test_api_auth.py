"""HTTP API authentication (SPEC U2): every request needs a credential that maps to a directory identity."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from harness.service.auth import CSRF_HEADER, SESSION_COOKIE
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    client_fixture,
    create,
    key,
    runtime_fixture,
)

#: the one route that answers without a credential: a load balancer's liveness probe, which says only
#: that the process answers (no data, no database)
UNAUTHENTICATED = {("GET", "/livez")}


def _api_routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) in the OpenAPI document that needs a credential, with ids filled in."""
    paths = client.get("/openapi.json").json()["paths"]
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "00000000-0000-0000-0000-000000000000", path))
        for path, operations in paths.items()
        for method in operations
    ]
    assert set(routes) >= UNAUTHENTICATED
    return [route for route in routes if route not in UNAUTHENTICATED]


def test_the_liveness_route_answers_without_a_credential_and_says_nothing_else(client: TestClient) -> None:
    """GET /livez is for load balancers: 200 without a key, and its body holds no data of the service."""
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-key"},
        {"X-API-Key": "not-a-key"},
        {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
        {"Authorization": "Bearer"},
        {"Cookie": f"{SESSION_COOKIE}=forged.123.abc"},
    ],
)
def test_every_endpoint_refuses_missing_or_bad_credentials(
    client: TestClient, headers: dict[str, str]
) -> None:
    """No endpoint in the OpenAPI document answers without a valid credential: a clear 401, never data."""
    routes = _api_routes(client)
    assert len(routes) >= 14
    for method, path in routes:
        response = client.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path, response.status_code, response.text)
        assert response.json()["error"] == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_both_header_styles_authenticate_the_same_identity(client: TestClient) -> None:
    """`Authorization: Bearer` and `X-API-Key` carry the same key to the same identity."""
    a = client.get("/api/v1/me", headers={"Authorization": "Bearer demo-carol-key"}).json()
    b = client.get("/api/v1/me", headers={"X-API-Key": "demo-carol-key"}).json()
    assert a == b == {"tenant_id": "default", "user_id": "carol", "roles": ["support_agent", "support_lead"]}


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/audit/verify", "/api/v1/audit/reconcile"])
def test_service_wide_views_need_an_operator(client: TestClient, path: str) -> None:
    """Metrics and audit checks span tenants, so only operators and auditors see them (403 for others)."""
    response = client.get(path, headers=key("alice"))
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def _login(client: TestClient, user: str) -> str:
    response = client.post(
        "/ui/login",
        content=f"api_key=demo-{user}-key&next=/ui/runs",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    cookie = response.cookies[SESSION_COOKIE]
    page = client.get("/ui/runs").text
    match = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
    assert match is not None
    assert cookie
    return match.group(1)


def test_console_session_writes_need_the_csrf_token(client: TestClient) -> None:
    """A cookie-authenticated write without the page's CSRF token is refused; with it, it succeeds."""
    token = _login(client, "alice")
    assert client.get("/api/v1/me").json()["user_id"] == "alice"
    refused = client.post("/api/v1/runs", json={"task": ORDER_STATUS})
    assert refused.status_code == 403 and refused.json()["error"] == "csrf"
    accepted = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers={CSRF_HEADER: token})
    assert accepted.status_code == 202 and accepted.json()["user_id"] == "alice"


def test_a_bad_login_is_refused_and_sets_no_cookie(client: TestClient) -> None:
    """A wrong key on the sign-in form gets 401 and no session."""
    response = client.post(
        "/ui/login",
        content="api_key=wrong&next=/ui/runs",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert response.status_code == 401
    assert SESSION_COOKIE not in response.cookies
    assert "not valid" in response.text


def test_login_never_redirects_off_the_console(client: TestClient) -> None:
    """The `next` parameter cannot send a signed-in user to another site (no open redirect)."""
    response = client.post(
        "/ui/login",
        content="api_key=demo-alice-key&next=https://evil.example/",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert response.headers["location"] == "/ui/runs"


def test_a_credential_gives_its_own_tenant_only(client: TestClient) -> None:
    """zoe (tenant acme) sees none of tenant default's Runs, and default sees none of acme's."""
    mine = create(client, ORDER_STATUS, "zoe")["run_id"]
    create(client, ORDER_STATUS, "alice")
    zoe_runs = client.get("/api/v1/runs", headers=key("zoe")).json()["runs"]
    assert [r["run_id"] for r in zoe_runs] == [mine]
    alice_runs = client.get("/api/v1/runs", headers=key("alice")).json()["runs"]
    assert mine not in [r["run_id"] for r in alice_runs]
