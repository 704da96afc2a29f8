"""docs/api.md is what the code says: regenerated from the docstrings and field comments of `Harness`,
`AsyncHarness` and the types they return, it equals the page in the repository, and nothing on it is
left undescribed."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = runpy.run_path(str(ROOT / "scripts" / "api_reference.py"))


def test_the_page_is_current() -> None:
    """The page in docs/ is the one the script writes now (run `python scripts/api_reference.py`)."""
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == SCRIPT["render"]()


def test_every_public_method_and_field_is_described() -> None:
    """Each public method has a docstring and each field of a result type a `#:` comment."""
    assert SCRIPT["undocumented"]() == []


def test_every_public_method_is_on_the_page() -> None:
    """Each public method and property of Harness and AsyncHarness has its own heading."""
    from harness.api import AsyncHarness, Harness

    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for cls in (Harness, AsyncHarness):
        for name in (n for n in vars(cls) if not n.startswith("_")):
            it = f"{cls.__name__}.{name}"
            headings = (f"`{it}(", f"`async {it}(", f"`{it}` (property)")
            assert any(h in page for h in headings), name
