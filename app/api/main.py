"""Every router of the HTTP API, assembled in one place."""

from fastapi import APIRouter

from app.api import fetch, metrics, produce, topics

api_router = APIRouter()
api_router.include_router(topics.router)
api_router.include_router(produce.router)
api_router.include_router(fetch.router)
api_router.include_router(metrics.router)
