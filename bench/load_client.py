"""The HTTP client the benchmarks load servers with: aiohttp, keep-alive, one connection per
concurrent client.

Not httpx (the SDK's client, which the benchmarks used before): on this 2-core machine httpx spent
about 2 ms of CPU per request, so every HTTP scenario measured its own client. Against
bench/empty_post_app.py with 8 concurrent clients, in one run: httpx 503 requests/s at 1,963 us of
client CPU per request, aiohttp 6,218 requests/s at 157 us. The client still shares the machine's
cores with the server and PostgreSQL; the CPU columns of each table show how much it takes.
"""

from __future__ import annotations

import aiohttp

JSON_HEADERS = {"content-type": "application/json"}


class LoadClient:
    """POSTs JSON bodies to one server; the session is made on first use, inside the running loop."""

    def __init__(self, base_url: str, connections: int, timeout_s: float = 60) -> None:
        self.base_url = base_url
        self.connections = connections
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                self.base_url,
                connector=aiohttp.TCPConnector(limit=self.connections),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._session

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """The status and the body of the answer."""
        async with self._open().post(path, data=body, headers=JSON_HEADERS) as response:
            return response.status, await response.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
