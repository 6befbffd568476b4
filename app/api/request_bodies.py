"""Request bodies: every body is JSON (docs/api.md), at most max_request_bytes.

curl's `-d` declares `application/x-www-form-urlencoded`; since the contract has no other body
format, a body declared as anything but JSON is read as JSON anyway, so `curl -d '{...}'` works.
Bodies over the limit are refused before they are read into memory."""

from __future__ import annotations

import orjson

from app.errors import invalid_request


class JsonBodies:
    """Pure ASGI middleware: declares every body JSON; checks Content-Length up front and counts
    streamed (chunked) bytes."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refusal(self, received: str):
        return invalid_request(
            f"the request body is {received}: expected at most {self.max_bytes} bytes "
            f"(setting max_request_bytes); send fewer records per request"
        )

    async def _refuse(self, send, received: str) -> None:
        error = self._refusal(received)
        await send(
            {
                "type": "http.response.start",
                "status": error.http_status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": orjson.dumps({"error": error.as_dict()})})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._refuse(send, f"{int(value)} bytes")
        # In place: the router records the matched route in this same scope, which the metrics read.
        scope["headers"] = [
            *(header for header in scope["headers"] if header[0] != b"content-type"),
            (b"content-type", b"application/json"),
        ]
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised while the route reads its body, so the API's error handlers render it.
                    raise self._refusal(f"over {self.max_bytes} bytes (streamed)")
            return message

        await self.app(scope, counting_receive, send)
