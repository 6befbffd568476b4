"""Request bodies parsed with orjson instead of the standard library (FastAPI calls request.json()).

orjson parses JSON several times faster, which matters on the produce path where one request carries
thousands of records; its decode error subclasses json.JSONDecodeError, so malformed bodies still
become 400 INVALID_REQUEST through FastAPI's own path.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def with_orjson_body(request: Request):
            return await handler(OrjsonRequest(request.scope, request.receive))

        return with_orjson_body
