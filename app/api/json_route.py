"""Request bodies parsed with orjson instead of the standard library (FastAPI calls request.json()),
and fast paths for the hot routes.

orjson parses JSON several times faster, which matters on the produce path where one request carries
thousands of records. Every router of app/api uses this route class: a route class set on a router
applies to the routes declared on it, not to the routers it includes.

A fast path (`with_fast_path`) answers the bodies it finds plainly valid without FastAPI's
validation and dependency solving, a large part of a small request's server CPU (a produce of a few
records, an EndTxn); it calls the route's dependencies itself. Whatever it declines
goes to the endpoint as FastAPI built it, so every 400 INVALID_REQUEST keeps that path's message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from app.api.request_limits import check_listed_entries

# serve(request, body): the answer, or None for the endpoint to answer through FastAPI.
FastPath = Callable[[Request, bytes], Awaitable[Response | None]]
Endpoint = TypeVar("Endpoint", bound=Callable)
_FAST_PATH = "txbroker_fast_path"


def with_fast_path(serve: FastPath) -> Callable[[Endpoint], Endpoint]:
    """Gives an endpoint of an OrjsonRoute router a fast path (apply it below the route decorator:
    the route reads it when it is declared)."""

    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, _FAST_PATH, serve)
        return endpoint

    return mark


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = orjson.loads(await self.body())
            except orjson.JSONDecodeError:
                # Python's parser takes what orjson refuses (NaN, Infinity, integers beyond 64 bits), so
                # the schema's validation names the field instead of answering "not valid JSON"; bodies
                # that neither parses fail there with the same message as before.
                self._json = await super().json()
            # Before FastAPI validates it: a refused count (partitions, records, headers) costs nothing
            # whatever the body's size.
            check_listed_entries(self.app.state.settings, self._json)
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()
        serve_fast: FastPath | None = getattr(self.endpoint, _FAST_PATH, None)

        async def with_orjson_body(request: Request):
            request = OrjsonRequest(request.scope, request.receive)
            if serve_fast is not None:
                answer = await serve_fast(request, await request.body())
                if answer is not None:
                    return answer
            return await handler(request)  # the body is cached on the request: read once

        return with_orjson_body
