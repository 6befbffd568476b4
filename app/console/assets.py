"""The console's static files (web/static): read once at import, served with content-hashed URLs so
browsers may cache them for good."""

from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

WEB_DIR = Path(__file__).resolve().parents[2] / "web"

router = APIRouter()


class StaticAssets:
    """web/static, read once; URLs carry a content hash so browsers may cache them for good."""

    def __init__(self, directory: Path) -> None:
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                body = path.read_bytes()
                media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                self.files[path.name] = (body, media_type, hashlib.sha256(body).hexdigest()[:12])

    def url(self, name: str) -> str:
        return f"/console/static/{name}?v={self.files[name][2]}"


assets = StaticAssets(WEB_DIR / "static")


@router.get("/static/{name}")
async def static_asset(name: str, v: str | None = None):
    found = assets.files.get(name)
    if found is None:
        return Response("not found", 404, media_type="text/plain")
    body, media_type, digest = found
    cache = "public, max-age=31536000, immutable" if v == digest else "no-cache"
    return Response(
        body,
        media_type=media_type,
        headers={"Cache-Control": cache, "ETag": f'"{digest}"', "X-Content-Type-Options": "nosniff"},
    )
