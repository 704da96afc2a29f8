"""The service's doors besides the API: `/docs` loads nothing from another host (it works offline), `/ui`
and `/ui/` lead to the console, and `/livez` answers a load balancer without a key while `/health` keeps
asking for one."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.acceptance.api_helpers import client_fixture, runtime_fixture  # noqa: F401 - fixtures


def test_docs_page_and_its_assets_come_from_the_service(client: TestClient) -> None:
    """Every script, style and icon the docs page names is served by the service itself."""
    page = client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert not re.search(r"""(src|href)=["']https?://""", page.text), "the docs page loads from another host"
    assets = re.findall(r"""(?:src|href)=["'](/[^"']+)["']""", page.text)
    assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200 and response.content, asset
    assert client.get("/openapi.json").status_code == 200


def test_ui_leads_to_the_console(client: TestClient) -> None:
    """`/ui` and `/ui/` redirect to the console's Runs page."""
    for path in ("/ui", "/ui/"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code in (302, 303, 307) and response.headers["location"] == "/ui/runs", path


def test_liveness_needs_no_key_and_health_still_does(client: TestClient) -> None:
    """`/livez` answers 200 without credentials; `/health` without a key is refused."""
    live = client.get("/livez")
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert client.get("/health").status_code == 401
    assert "/livez" in client.get("/openapi.json").json()["paths"]
