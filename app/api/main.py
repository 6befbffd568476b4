"""Every router of the HTTP API, assembled in one place."""

from app.api import admin, fetch, groups, metrics, produce, security, topics, transactions

# Included one by one on the app (app/server.py), not through a parent router: FastAPI 0.165 walks a
# nested router's tree again on every match (58 -> 22 us to route POST /v1/txn/end). Starlette tries
# routes in order, so the hot paths come first; the paths of different routers never overlap, so the
# order changes no answer.
api_routers = [
    produce.produce_router,
    transactions.router,
    fetch.router,
    groups.router,
    topics.router,
    produce.router,
    admin.router,
    security.router,
    metrics.router,
]
