"""The service's doors that are not the API: the interactive API docs served from this process (no CDN, so
`/docs` works on a machine without internet), `/ui` leading to the console, and the liveness route a load
balancer polls without a key (`/health`, the deep check of the database, stays authenticated)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

#: where Swagger UI's own files (scripts, styles) are served
DOCS_ASSETS = "/docs/assets"
#: Swagger UI 5 (it reads OpenAPI 3.1, the version FastAPI writes), as shipped by the fastapi-offline package
SWAGGER_UI_FILES = files("fastapi_offline") / "static"

router = APIRouter()


class LiveDoc(BaseModel):
    """The process is up and answers requests."""

    status: str = "ok"


@router.get("/livez", response_model=LiveDoc, summary="Liveness")
def livez() -> LiveDoc:
    """Whether this process answers: no key needed, nothing read; for load balancers and orchestrators.
    `/health` (with a key) checks the database too."""
    return LiveDoc()


@router.get("/ui", include_in_schema=False)
@router.get("/ui/", include_in_schema=False)
def console_home() -> RedirectResponse:
    return RedirectResponse("/ui/runs", status_code=307)


def install(app: FastAPI) -> None:
    """Add the docs page, its assets, the console's front door and the liveness route to `app` (built with
    docs_url=None, so that FastAPI's own page, which loads its assets from a CDN, is not there)."""
    app.include_router(router)
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(SWAGGER_UI_FILES)), name="docs-assets")
    title = f"{app.title} - API"

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=title,
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url="/favicon.ico", oauth2_redirect_url="/docs/oauth2-redirect")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
