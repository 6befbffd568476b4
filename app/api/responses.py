"""Response helpers: bodies are serialized once, with orjson."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.responses import Response

from app.coordinator.fetch import NO_OFFSET
from app.errors import BrokerError


def _serialize(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:
        # A request may carry a lone surrogate ("\ud800") that we echo back (an unknown topic's
        # name): orjson refuses it, the standard library writes it as the same JSON escape.
        return json.dumps(body, ensure_ascii=True).encode("ascii")


def json_response(body: Any, status_code: int = 200, headers: dict | None = None) -> Response:
    return Response(_serialize(body), status_code=status_code, media_type="application/json", headers=headers)


def error_response(error: BrokerError) -> Response:
    headers = {"Retry-After": "1"} if error.http_status == 503 else None
    return json_response({"error": error.as_dict()}, error.http_status, headers)


def error_or_none(error: BrokerError | None) -> dict | None:
    return None if error is None else error.as_dict()


def watermarks(state) -> dict:
    """The watermarks of a partition entry; -1 when the partition could not be read."""
    if state is None:
        return {"high_watermark": NO_OFFSET, "last_stable_offset": NO_OFFSET, "log_start_offset": NO_OFFSET}
    return {
        "high_watermark": state.high_watermark,
        "last_stable_offset": state.last_stable_offset,
        "log_start_offset": state.log_start_offset,
    }
