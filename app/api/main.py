"""Every router of the HTTP API, assembled in one place."""

from fastapi import APIRouter

from app.api import admin, fetch, groups, metrics, produce, security, topics, transactions
from app.api.json_route import OrjsonRoute

api_router = APIRouter(route_class=OrjsonRoute)
api_router.include_router(topics.router)
api_router.include_router(produce.produce_router)
api_router.include_router(produce.router)
api_router.include_router(fetch.router)
api_router.include_router(transactions.router)
api_router.include_router(groups.router)
api_router.include_router(admin.router)
api_router.include_router(security.router)
api_router.include_router(metrics.router)
