"""The web console (/console): server-rendered pages for people, readable without JavaScript and
refreshed live with it (the script asks for a page's live block only, header X-Console-Fragment).

- `pages`: what each page reads (one snapshot) and renders; the admin abort.
- `session`: who may look (Describe on the Cluster), sign-in with an API key in an HttpOnly cookie,
  the cross-site check on POSTs.
- `visibility`: what a page shows its principal (what the API would: its Describe and Read ACLs).
- `rendering`: the Jinja2 environment, whole pages or live blocks, security headers (a CSP with no
  inline script).
- `formatting`: numbers, durations, times and page URLs for the templates.
- `assets`: web/static with content-hashed URLs. `throughput`: offsets-per-second figures.

It is part of the HTTP layer, beside app/api (whose dependencies and token check it uses); the app
factory mounts it.
"""

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from app.api.cross_site import refuse_cross_site_writes
from app.console import assets, pages, session
from app.console.rendering import error_page
from app.errors import BrokerError

# Writes from another site's pages are refused with a page here (the API's by CrossSiteWrites).
router = APIRouter(include_in_schema=False, dependencies=[Depends(refuse_cross_site_writes)])
router.include_router(session.router, prefix="/console")
router.include_router(assets.router, prefix="/console")
router.include_router(pages.router, prefix="/console")  # last: it ends with the catch-all "not found" page


def error_page_of(request: Request, error: BrokerError) -> Response | None:
    """A console address answers what went wrong before or outside its page handler (a query
    parameter out of range, a text PostgreSQL cannot store) with a page too, not the API's JSON."""
    if request.url.path == "/console" or request.url.path.startswith("/console/"):
        return error_page(request, error)
    return None
