"""The files a Run's sandboxed skill wrote, over HTTP with real credentials: listed with the Run, downloaded
by who may read the Run (an API key of its tenant, or the console session of one), checked against their
SHA-256, always as an attachment; another tenant gets 404 for the list, the file and the page alike. What
the skill printed is shown with the Run, without the secrets it printed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from harness.clock import SystemClock
from harness.config import Runtime
from tests.acceptance.api_helpers import make_client
from tests.integration.test_artifacts import PNG, PRINTED, WARNED, sandbox_runtime
from tests.integration.test_sandbox import need_bwrap

KEYS = {"tess": "files-test-tess-key", "lee": "files-test-lee-key", "mallory": "files-test-mallory-key"}
TENANTS = {"tess": "t1", "lee": "t1", "mallory": "t2"}


def key(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[user]}"}


@pytest.fixture
def runtime(tmp_path: Path, backend_url: str) -> Iterator[Runtime]:
    need_bwrap()
    identities = tmp_path / "identities.yaml"
    identities.write_text(yaml.safe_dump({"identities": {
        f"{TENANTS[user]}/{user}": {"roles": ["tester"], "api_key_sha256": hashlib.sha256(k.encode()).hexdigest()}
        for user, k in KEYS.items()}}))
    # the service's worker and its waits run on real time
    rt = sandbox_runtime(tmp_path, backend_url, SystemClock(), identities_file=identities)
    yield rt
    rt.close()


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with make_client(runtime) as c:
        yield c


def sign_in(client: TestClient, user: str) -> None:
    response = client.post("/ui/login", content=f"api_key={KEYS[user]}&next=/ui/runs",
                           headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert response.status_code == 303


def test_the_owner_downloads_a_file_a_sandboxed_skill_wrote_and_another_tenant_cannot(
        client: TestClient, runtime: Runtime) -> None:
    """The Run document lists the kept files; its tenant lists and downloads them (API key and console
    session), byte for byte, as attachments; another tenant gets 404 for the list, each file and the
    page; no credential is a 401; an unknown hash a 404."""
    created = client.post("/api/v1/runs", json={"task": "report"}, headers=key("tess"), params={"wait": "true"})
    assert created.status_code == 202, created.text
    doc = created.json()
    assert doc["state"] == "SUCCEEDED", doc["error"]
    run_id = doc["run_id"]
    assert [f["name"] for f in doc["files"]] == ["chart.png", "out/report.csv"]
    assert doc["streams"]["a"]["stdout"].startswith("token ") and doc["streams"]["a"]["stderr"].startswith("key ")
    assert PRINTED not in created.text and WARNED not in created.text  # the secrets the skill printed
    chart = doc["files"][0]
    base = f"/api/v1/runs/{run_id}/files"

    listing = client.get(base, headers=key("tess")).json()
    assert [f["url"] for f in listing["files"]] == [f"{base}/{f['sha256']}" for f in doc["files"]]
    assert {s["name"] for s in listing["skipped"]} == {"big.bin", "z_extra.txt"}
    for user in ("tess", "lee"):  # the requester, and another person of the Run's tenant
        got = client.get(f"{base}/{chart['sha256']}", headers=key(user))
        assert got.status_code == 200 and got.content == PNG
        assert got.headers["content-type"] == "image/png"
        assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''chart.png"
        assert got.headers["x-content-type-options"] == "nosniff"

    for path in (base, f"{base}/{chart['sha256']}"):
        assert client.get(path, headers=key("mallory")).status_code == 404
        assert client.get(path).status_code == 401
    assert client.get(f"{base}/{'0' * 64}", headers=key("tess")).status_code == 404

    sign_in(client, "tess")
    page = client.get(f"/ui/runs/{run_id}").text
    link = f'href="{base}/{chart["sha256"]}"'
    assert link in page and "out/report.csv" in page and "HARNESS_ARTIFACT_MAX_BYTES" in page
    assert 'data-stream="a-stdout"' in page and PRINTED not in page and WARNED not in page
    assert client.get(f"{base}/{chart['sha256']}").content == PNG  # the console's link, on its session
    client.cookies.clear()
    sign_in(client, "mallory")
    assert client.get(f"/ui/runs/{run_id}").status_code == 404
    assert client.get(f"{base}/{chart['sha256']}").status_code == 404
