"""The web console (/console): server-rendered pages for people, readable without JavaScript and
refreshed live with it (the script asks for a page's live block only, header X-Console-Fragment).

- `pages`: what each page reads (one snapshot) and renders; the admin abort.
- `session`: who may look (Describe on the Cluster), sign-in with an API key in an HttpOnly cookie,
  the cross-site check on POSTs.
- `rendering`: the Jinja2 environment, whole pages or live blocks, security headers (a CSP with no
  inline script).
- `formatting`: numbers, durations, times and page URLs for the templates.
- `assets`: web/static with content-hashed URLs. `throughput`: offsets-per-second figures.

It is part of the HTTP layer, beside app/api (whose dependencies and token check it uses); the app
factory mounts it.
"""

from fastapi import APIRouter

from app.console import assets, pages, session

router = APIRouter(include_in_schema=False)
router.include_router(session.router, prefix="/console")
router.include_router(assets.router, prefix="/console")
router.include_router(pages.router, prefix="/console")  # last: it ends with the catch-all "not found" page
