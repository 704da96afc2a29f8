"""`harness kb add|list|remove` and the knowledge-base API as users drive them, on SQLite, PostgreSQL and
MariaDB: Markdown, plain text and PDF in; a bad file, an unknown id or another tenant's document refused
with a clear message (exit 2, 404, 422) and no traceback; editors only may change a tenant's documents, and
only their own tenant's."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.agents import support_agent
from harness.cli import app
from harness.config import Runtime, build_runtime
from harness.examples.support import EXAMPLE_DIR
from harness.settings import Settings
from tests.acceptance.api_helpers import key, make_client
from tests.knowledge_files import HANDBOOK_MD, SHIPPING_TXT, tiny_pdf


@dataclass
class Ran:
    """What one `harness` command did."""

    returncode: int
    stdout: str
    stderr: str


def harness(*args: str) -> Ran:
    """The `harness` command line, run in this process."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return Ran(result.exit_code, result.stdout, result.stderr)


def test_the_cli_adds_lists_and_removes_documents(backend_url: str, tmp_path: Path) -> None:
    """Three kinds of file go in with one command; list shows them by tenant and tag; remove takes one out;
    bad files, an unknown id and another tenant's document are exit 2 with the reason on stderr."""
    (tmp_path / "handbook.md").write_text(HANDBOOK_MD)
    (tmp_path / "shipping.txt").write_text(SHIPPING_TXT)
    pdf = tiny_pdf(tmp_path / "warranty.pdf", ["Warranty claims need the original receipt."])
    added = harness("kb", "add", str(tmp_path / "handbook.md"), str(tmp_path / "shipping.txt"), str(pdf),
                    "--tenant", "t1", "--tag", "policy", "--db", backend_url, "--json")
    assert added.returncode == 0, added.stderr
    docs = json.loads(added.stdout)["documents"]
    assert [(d["title"], d["media_type"], d["stored"]) for d in docs] == [
        ("handbook.md", "text/markdown", True), ("shipping.txt", "text/plain", True),
        ("warranty.pdf", "application/pdf", True)]
    listed = json.loads(harness("kb", "list", "--tenant", "t1", "--tag", "policy", "--db", backend_url,
                                "--json").stdout)
    assert [d["document_id"] for d in listed["documents"]] == [d["document_id"] for d in docs]
    assert json.loads(harness("kb", "list", "--tenant", "t2", "--db", backend_url, "--json").stdout)[
        "documents"] == []
    found = json.loads(harness("kb", "search", "warranty receipt", "--tenant", "t1", "--db", backend_url,
                               "--json").stdout)["chunks"]
    assert found[0]["title"] == "warranty.pdf"

    (tmp_path / "empty.txt").write_text("")
    for args, message in (
            (("add", str(tmp_path / "missing.md")), "missing.md: no such file"),
            (("add", str(tmp_path / "empty.txt")), "empty.txt: holds no text"),
            (("add", str(tmp_path)), "not a Markdown"),
            (("remove", "no-such-document"), "no knowledge-base document 'no-such-document' in tenant 't1'"),
            (("remove", docs[0]["document_id"], "--tenant", "t2"), "in tenant 't2'")):
        ran = harness("kb", *args, *(() if "--tenant" in args else ("--tenant", "t1")), "--db", backend_url)
        assert ran.returncode == 2 and message in ran.stderr and "Traceback" not in ran.stderr, ran
    removed = harness("kb", "remove", docs[0]["document_id"], "--tenant", "t1", "--db", backend_url, "--json")
    assert removed.returncode == 0 and json.loads(removed.stdout)["chunks_removed"] == docs[0]["chunks"]
    assert len(json.loads(harness("kb", "list", "--tenant", "t1", "--db", backend_url, "--json").stdout)[
        "documents"]) == 2


OLGA_KEY = "acme-olga-key-0123456789"


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The support example's runtime on the backend under test: its identities and demo API keys, and olga,
    a knowledge editor of the acme tenant."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    identities = yaml.safe_load((EXAMPLE_DIR / "identities.yaml").read_text())
    identities["identities"]["acme/olga"] = {"roles": ["knowledge_editor"],
                                             "api_key_sha256": hashlib.sha256(OLGA_KEY.encode()).hexdigest()}
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    runtime = build_runtime(Settings(db=backend_url, data_dir=tmp_path / "data",
                                     identities_file=tmp_path / "identities.yaml"), agent=support_agent())
    yield runtime
    runtime.close()


def test_the_api_confines_documents_to_the_callers_tenant(rt: Runtime, tmp_path: Path) -> None:
    """An operator adds a Markdown file and a PDF to their tenant; a support agent may list but not change;
    another tenant neither sees nor removes them; bad input is a 422 naming the problem."""
    pdf = base64.b64encode(tiny_pdf(tmp_path / "w.pdf", ["Warranty lasts two years."]).read_bytes()).decode()
    with make_client(rt) as client:
        md = client.post("/api/v1/kb/documents", headers=key("operator"),
                         json={"name": "handbook.md", "text": HANDBOOK_MD, "kb": "handbook", "tags": ["policy"]})
        assert md.status_code == 201, md.text
        assert (md.json()["media_type"], md.json()["chunks"], md.json()["stored"]) == ("text/markdown", 2, True)
        again = client.post("/api/v1/kb/documents", headers=key("operator"),
                            json={"name": "handbook.md", "text": HANDBOOK_MD, "kb": "handbook", "tags": ["policy"]})
        assert again.json()["stored"] is False and again.json()["document_id"] == md.json()["document_id"]
        assert client.post("/api/v1/kb/documents", headers=key("operator"),
                           json={"name": "w.pdf", "content_base64": pdf}).json()["media_type"] == "application/pdf"
        assert client.post("/api/v1/kb/documents", headers=key("alice"),
                           json={"name": "x.md", "text": "x"}).status_code == 403
        listed = client.get("/api/v1/kb/documents", headers=key("alice"), params={"kb": "handbook"})
        assert [d["title"] for d in listed.json()["documents"]] == ["handbook.md"]
        assert client.get("/api/v1/kb/documents", headers=key("zoe")).json()["documents"] == []
        assert client.get("/api/v1/kb/documents").status_code == 401
        for body, message in (({"name": "empty.md", "text": "  "}, "empty.md: holds no text"),
                              ({"name": "a.png", "text": "x"}, "not a Markdown"),
                              ({"name": "a.pdf", "content_base64": "not base64!"}, "not valid base64"),
                              ({"name": "a.md"}, "exactly one of text and content_base64")):
            bad = client.post("/api/v1/kb/documents", headers=key("operator"), json=body)
            assert bad.status_code == 422 and message in bad.json()["detail"], bad.text
        document_id = md.json()["document_id"]
        olga = {"Authorization": f"Bearer {OLGA_KEY}"}
        assert client.delete(f"/api/v1/kb/documents/{document_id}", headers=key("zoe")).status_code == 403
        assert client.delete(f"/api/v1/kb/documents/{document_id}", headers=olga).status_code == 404
        own = client.post("/api/v1/kb/documents", headers=olga, json={"name": "acme.md", "text": "# Acme\nOurs."})
        assert own.status_code == 201 and [d["title"] for d in client.get(
            "/api/v1/kb/documents", headers=olga).json()["documents"]] == ["acme.md"]
        assert client.delete("/api/v1/kb/documents/nope", headers=key("operator")).status_code == 404
        gone = client.delete(f"/api/v1/kb/documents/{document_id}", headers=key("operator"))
        assert gone.status_code == 200 and gone.json()["chunks_removed"] == 2
