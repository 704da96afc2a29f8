"""The web console (SPEC U3): server-rendered pages over the same documents as the API.

Pages read; actions (start a Run, decide, cancel) call the JSON API from the page with the session
cookie and the page's CSRF token. Signing in exchanges an API key for a signed session cookie once.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from harness.domain.traces import policy_passed, policy_verdicts
from harness.kernel.states import FINAL, RunState
from harness.pipeline.artifacts import skipped_files_of
from harness.pipeline.trace_groups import group_records
from harness.policy.hitl import BREAK_GLASS_ROLE
from harness.service import views
from harness.service.auth import SESSION_COOKIE, Principal, session_principal
from harness.service.console_format import FILTERS, GLOBALS
from harness.service.core import Service, service_of
from harness.service.errors import ApiError
from harness.service.schemas import ApprovalDoc
from harness.skills.manifests import currency_fields

TEMPLATES = Jinja2Templates(directory=Path(__file__).resolve().parents[1] / "console" / "templates")
TEMPLATES.env.filters.update(FILTERS)
TEMPLATES.env.globals.update(GLOBALS)
router = APIRouter(prefix="/ui", include_in_schema=False)
Page = HTMLResponse | RedirectResponse


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?next={urllib.parse.quote(target)}", status_code=303)


def _page(
    request: Request, svc: Service, caller: Principal, template: str, status: int = 200, *,
    cursor: int | None = None, **context: Any
) -> HTMLResponse:
    """Render a console page. `cursor` is the change-feed position the page's live updates start after:
    pages that show Run state take it *before* reading that state, so a change committed while the page
    was being built is delivered by the event stream instead of falling between the two reads."""
    token = request.cookies.get(SESSION_COOKIE, "")
    pending = len(svc.ops.hitl.pending(caller.tenant_id))
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {
            "caller": caller,
            "csrf": svc.auth.signer.csrf_token(token),
            "pending_count": pending,
            "can_break_glass": BREAK_GLASS_ROLE in caller.identity.roles,
            "cursor": svc.ops.reads.latest_cursor() if cursor is None else cursor,
            **context,
        },
        status_code=status,
    )


def _allowed(svc: Service, caller: Principal, request_id: str) -> dict[str, str | None]:
    """Why the caller may not approve / reject this request (None where they may): the console shows a
    button the caller may not use disabled, with the reason."""
    request = svc.ops.approval(request_id, caller.tenant_id)
    return {d: svc.ops.hitl.refusal(request, caller.identity, d) for d in ("approve", "reject")}


def _currencies(svc: Service, approvals: list[ApprovalDoc]) -> dict[str, dict[str, str]]:
    """For each skill the approvals' actions call, its arguments that are amounts of money and their
    currency, as its manifest declares them (none for a skill this process does not have)."""
    found: dict[str, dict[str, str]] = {}
    for action in (a for approval in approvals for a in approval.actions):
        skill = svc.ops.registry.get(action.skill)
        found[action.skill] = currency_fields(skill.manifest.input_schema) if skill else {}
    return found


def _safe_next(target: str | None) -> str:
    """Only redirect within the console (no open redirect)."""
    if target and target.startswith("/ui/") and not target.startswith("//"):
        return target
    return "/ui/runs"


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    """The sign-in form."""
    return TEMPLATES.TemplateResponse(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse, response_model=None)
async def login(request: Request) -> Response:
    """Exchange an API key for a session cookie."""
    svc = service_of(request)
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("api_key") or [""])[0].strip()
    target = _safe_next((form.get("next") or [""])[0])
    found = svc.auth.from_key(key) if key else None
    if found is None:
        return TEMPLATES.TemplateResponse(
            request, "login.html", {"next": target, "error": "That API key is not valid."}, status_code=401
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        svc.auth.signer.issue(found.key_hash),
        httponly=True,
        samesite="strict",
        secure=svc.settings.cookie_secure,
        max_age=int(svc.settings.session_ttl_s),
        path="/",
    )
    return response


@router.post("/logout")
def logout() -> RedirectResponse:
    """End the console session."""
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/runs", response_class=HTMLResponse, response_model=None)
def runs_page(request: Request, state: Annotated[str | None, Query()] = None) -> Page:
    """The run list: live state and legacy status of the tenant's newest Runs."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    valid_state = state if state in {s.value for s in RunState} else None
    cursor = svc.ops.reads.latest_cursor()  # before the rows: see _page
    rows = svc.ops.reads.list_runs(caller.tenant_id, state=valid_state, limit=100)
    return _page(
        request,
        svc,
        caller,
        "runs.html",
        cursor=cursor,
        runs=rows,
        state_filter=valid_state,
        states=[s.value for s in RunState],
        now=svc.ops.clock.now(),
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse, response_model=None)
def run_page(request: Request, run_id: str) -> Page:
    """One Run: timeline with durations, answer or error, cost, policy verdicts, trace tree, approval."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    cursor = svc.ops.reads.latest_cursor()  # before the Run is read: see _page
    try:
        run = svc.owned_run(caller, run_id)
    except ApiError:
        return _page(request, svc, caller, "missing.html", status=404, run_id=run_id)
    doc = views.run_document(svc.ops, run)
    trace = views.trace_document(svc.ops, run)
    verdicts = [v for r in trace.records if r.kind == "policy" for v in policy_verdicts(r.data)]
    passed = sum(policy_passed(r.data) or 0 for r in trace.records if r.kind == "policy")
    approval, refusals = None, {}
    if doc.approval_request_id:
        approval = views.approval_document(svc.ops, svc.ops.approval(doc.approval_request_id))
        refusals[approval.request_id] = _allowed(svc, caller, approval.request_id)
    return _page(
        request,
        svc,
        caller,
        "run.html",
        cursor=cursor,
        run=doc,
        trace=trace,
        groups=group_records(trace.records, lambda r: (r.kind, r.data)),
        verdicts=verdicts,
        passed=passed,
        approval=approval,
        currencies=_currencies(svc, [approval] if approval else []),
        refusals=refusals,
        is_final=run.state in FINAL,
        now=svc.ops.clock.now(),
        skipped_files=skipped_files_of(run.context),
    )


@router.get("/approvals", response_class=HTMLResponse, response_model=None)
def approvals_page(request: Request) -> Page:
    """The approvals inbox: approve, reject or break-glass, each with a reason."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    svc.ops.expire_approvals()
    cursor = svc.ops.reads.latest_cursor()  # before the requests are read: see _page
    pending = [views.approval_document(svc.ops, r) for r in svc.ops.hitl.pending(caller.tenant_id)]
    refusals = {a.request_id: _allowed(svc, caller, a.request_id) for a in pending}
    return _page(request, svc, caller, "approvals.html", cursor=cursor, approvals=pending, refusals=refusals,
                 currencies=_currencies(svc, pending), now=svc.ops.clock.now())
