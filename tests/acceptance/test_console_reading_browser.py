"""The console read in a real browser on a narrow screen, and the API's /docs page: screenshots of both go
to a temporary folder (and to test-artifacts/), and the DOM is checked, not just the files: at 420 px every
navigation item, the identity and "Sign out" sit inside the window on the dark bar, legible; the approval
card shows the amount in euro; the policy section has one count; /docs draws the API's operations."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from .test_console_browser import ARGS, ARTIFACTS, CHROMIUM, _sign_in, playwright_api
from .test_console_browser import server as _server_fixture

server = _server_fixture
NARROW = {"width": 420, "height": 860}

#: for each element: its box, whether it is visible and on top at its centre, its text colour and the colour
#: of the first opaque background behind it (WCAG contrast is computed from these)
_LOOK = """
els => els.map(el => {
  const box = el.getBoundingClientRect();
  const style = getComputedStyle(el);
  let bg = null;
  for (let node = el; node && !bg; node = node.parentElement) {
    const c = getComputedStyle(node).backgroundColor;
    if (c && c !== 'transparent' && !/rgba\\(.*, 0\\)$/.test(c)) bg = c;
  }
  const top = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
  return {text: el.innerText.trim(), left: box.left, right: box.right, top: box.top, bottom: box.bottom,
          visible: style.visibility !== 'hidden' && style.display !== 'none' && box.width > 0 && box.height > 0,
          onTop: !!top && (el === top || el.contains(top) || top.contains(el)),
          color: style.color, background: bg || 'rgb(255, 255, 255)'};
})
"""


def _rgb(css: str) -> tuple[float, float, float]:
    parts = css[css.index("(") + 1: css.index(")")].split(",")
    r, g, b = (float(p) for p in parts[:3])
    return r, g, b


def _luminance(css: str) -> float:
    def channel(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(v) for v in _rgb(css))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """The WCAG contrast ratio of two CSS rgb() colours."""
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_reads_css_colours() -> None:
    """The contrast helper agrees with WCAG's endpoints (black on white 21:1, a colour on itself 1:1)."""
    assert contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21.0)
    assert contrast("rgba(201, 209, 221, 1)", "rgb(201, 209, 221)") == pytest.approx(1.0)


def _save(page: Any, folder: Path, name: str) -> Path:
    target = folder / name
    page.screenshot(path=target, full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(target, ARTIFACTS / name)
    return target


def _waiting_refund(base: str) -> str:
    """A Run of alice's that waits for a support lead: a refund of 180 EUR."""
    doc = httpx.post(f"{base}/api/v1/runs", json={"task": "Refund 180 EUR for order A-1003"},
                     headers={"X-API-Key": "demo-alice-key"}, params={"wait": "true"}, timeout=30).json()
    assert doc["state"] == "AWAITING_HITL", doc
    return str(doc["run_id"])


def test_at_420_px_the_navigation_stays_on_the_bar_and_readable(server: str, tmp_path: Path) -> None:
    """On a 420 px window every section of the navigation, the signed-in identity and "Sign out" are inside
    the window, inside the dark bar, on top, with text at 4.5:1 contrast or more against what is behind it;
    the page does not scroll sideways."""
    run_id = _waiting_refund(server)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport=NARROW)
        _sign_in(page, server, "demo-carol-key")
        for path in ("/ui/runs", f"/ui/runs/{run_id}", "/ui/approvals", "/ui/costs", "/ui/sandboxes"):
            page.goto(f"{server}{path}")
            bar = page.eval_on_selector("header.top", "el => el.getBoundingClientRect().toJSON()")
            items = page.eval_on_selector_all("header.top nav a, header.top .identity, header.top button.link", _LOOK)
            names = [i["text"].split("\n")[0].split(" ")[0] for i in items]
            assert names[:5] == ["Runs", "Approvals", "Costs", "Webhooks", "Sandboxes"], names
            assert "Sign" in names, names
            for item in items:
                where = f"{path}: {item['text']!r}"
                assert item["visible"] and item["onTop"], where
                assert item["left"] >= 0 and item["right"] <= NARROW["width"], (where, item)
                assert bar["top"] <= item["top"] and item["bottom"] <= bar["bottom"], (where, item, bar)
                assert contrast(item["color"], item["background"]) >= 4.5, (where, item)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= NARROW["width"], f"{path} scrolls sideways: {width} px"
        page.goto(f"{server}/ui/approvals")
        _save(page, tmp_path, "console-narrow-approvals.png")
        page.goto(f"{server}/ui/runs/{run_id}")
        shot = _save(page, tmp_path, "console-narrow-run.png")
        browser.close()
    assert shot.stat().st_size > 10_000


def test_the_approval_card_and_the_policy_section_read_as_people_count(server: str, tmp_path: Path) -> None:
    """The inbox card of a 180 EUR refund shows "180.00 EUR" for each amount; the run page's policy section
    opens with one total that its parts add up to, and nothing costs more than $0.00 with the offline model."""
    run_id = _waiting_refund(server)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _sign_in(page, server, "demo-carol-key")
        page.goto(f"{server}/ui/approvals")
        card = page.locator(f"article.card:has(a[href='/ui/runs/{run_id}'])")
        amounts = card.locator("[data-currency]").all_inner_texts()
        assert amounts == ["180.00 EUR", "180.00 EUR"], amounts
        page.goto(f"{server}/ui/runs/{run_id}")
        summary = page.inner_text("[data-testid=verdict-summary]")
        total, passing, waiting = (int(w) for w in summary.replace(":", " ").split() if w.isdigit())
        assert summary.startswith(f"{total} checks") and passing + waiting == total, summary
        assert "need approval" in summary
        assert page.inner_text("[data-testid=run-cost]").startswith("$0.00 ·")
        assert "1 API call" in page.inner_text("[data-testid=run-cost]")
        numbers = [int(n) for n in page.locator(".step-no").all_inner_texts()]
        assert numbers == list(range(1, len(numbers) + 1)), numbers
        _save(page, tmp_path, "console-run-reading.png")
        browser.close()


def test_docs_draws_the_api_from_the_service_itself(server: str, tmp_path: Path) -> None:
    """/docs renders Swagger UI from the service's own assets (no other host is asked): its title and the
    runs operations are on the page and visible, and a screenshot of it is kept."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        hosts: set[str] = set()
        page.on("request", lambda r: hosts.add(r.url.split("/")[2]))
        page.goto(f"{server}/docs")
        page.wait_for_selector(".swagger-ui", timeout=20_000)
        page.wait_for_load_state("networkidle")
        shot = _save(page, tmp_path, "docs.png")  # kept whether the page draws or not: it shows why
        assert hosts == {server.split("/")[2]}, hosts
        assert shot.stat().st_size > 10_000
        assert page.locator(".swagger-ui .errors-wrapper").count() == 0, page.inner_text(".swagger-ui")
        assert page.locator(".swagger-ui .info .title").first.is_visible()
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        assert any(p.startswith("/api/v1/runs") for p in paths), paths
        browser.close()
