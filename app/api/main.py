"""Every router of the HTTP API, assembled in one place."""

from app.api import admin, fetch, groups, metrics, produce, security, topics, transactions

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
