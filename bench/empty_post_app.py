"""The plain HTTP ceiling: txbroker's server stack (uvicorn with uvloop and httptools, one worker, a
FastAPI app) with a single POST route that does nothing. Whatever txbroker does per request costs
on top of this.

    python -m bench.empty_post_app FD     serves on the already-bound socket FD
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI
from fastapi.responses import Response

app = FastAPI()
EMPTY_JSON = b"{}"


@app.post("/empty")
async def empty() -> Response:
    return Response(EMPTY_JSON, media_type="application/json")


@app.get("/ready")
async def ready() -> Response:
    return Response(EMPTY_JSON, media_type="application/json")


if __name__ == "__main__":
    uvicorn.run(app, fd=int(sys.argv[1]), loop="uvloop", http="httptools", log_level="warning", access_log=False)
