"""One HTTP connection pool to one txbroker server, speaking the contract (docs/api.md): JSON bodies in,
JSON bodies out, error bodies turned into `txbroker.errors` exceptions.

This is the single boundary where httpx's exceptions become the SDK's (`raise ... from`): a
transport failure is a `TxbrokerConnectionError` (retriable: the outcome is unknown, and every
state-changing request of the contract is safe to retry with the same body); an answer that is not
the contract's (a 2xx whose body is not a JSON object, a body that does not decode) is an
`InvalidResponseError`, one of them (its outcome is unknown too); an error response is the class of
its code. Nothing above this module sees httpx, nor an answer that is not a JSON object.

The transport is pluggable (`transport=`): an `httpx.AsyncBaseTransport` such as
`httpx.MockTransport` or `httpx.ASGITransport(app)`, or a synchronous `httpx.BaseTransport`, which
is run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx

from txbroker import errors

try:  # optional: faster JSON when present (the SDK needs httpx alone)
    import orjson

    def _dumps(body: Any) -> bytes:
        return orjson.dumps(body)

    _loads = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is absent

    def _dumps(body: Any) -> bytes:
        return json.dumps(body, separators=(",", ":")).encode()

    _loads = json.loads

DEFAULT_URL = "http://127.0.0.1:8080"
USER_AGENT = "txbroker-python"


class _ThreadedTransport(httpx.AsyncBaseTransport):
    """Adapts a synchronous transport (httpx.HTTPTransport, a sync MockTransport handler) to the
    async core by running each request in a worker thread."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        def call() -> httpx.Response:
            response = self._transport.handle_request(request)
            try:
                content = response.read()
            finally:
                response.close()
            return httpx.Response(response.status_code, headers=response.headers, content=content, request=request)

        return await asyncio.to_thread(call)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._transport.close)


def _async_transport(transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None):
    if transport is None or isinstance(transport, httpx.AsyncBaseTransport):
        return transport
    if isinstance(transport, httpx.BaseTransport):
        return _ThreadedTransport(transport)
    raise TypeError(f"transport must be an httpx transport, not {type(transport).__name__}")


class Connection:
    """Requests to one server. `token` is sent as `Authorization: Bearer <token>`; `headers` go on
    every request (tracing, a gateway's own credentials)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.url = _server_url(url)
        if token is not None and not _is_header_value(token):
            raise ValueError(
                "token must be printable ASCII, as the API keys `txbroker principals add-key` prints are; this "
                "one holds a line break, a control character or a character outside ASCII: copy the key again"
            )
        self.request_timeout_s = request_timeout_ms / 1000
        all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        self._headers = all_headers
        self._transport = _async_transport(transport)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        # Created on first use, inside the event loop that will use it.
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                transport=self._transport,
                timeout=httpx.Timeout(self.request_timeout_s, connect=min(self.request_timeout_s, 10)),
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            )
        return self._client

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping | None = None,
        extra_timeout_s: float = 0,
        accept: tuple[int, ...] = (),
    ) -> Any:
        """The decoded JSON object of the response (None for 204); raises the error class of an error
        response (unless its status is in `accept`), TxbrokerConnectionError when no response
        arrived, InvalidResponseError when the one that did is not the contract's."""
        content = None if body is None else _dumps(body)
        headers = None if body is None else {"Content-Type": "application/json"}
        timeout = (
            httpx.USE_CLIENT_DEFAULT
            if not extra_timeout_s
            else httpx.Timeout(self.request_timeout_s + extra_timeout_s, connect=min(self.request_timeout_s, 10))
        )
        try:
            response = await self._http().request(
                method,
                path,
                content=content,
                headers=headers,
                params={k: v for k, v in params.items() if v is not None} if params else None,
                timeout=timeout,
            )
        except httpx.HTTPError as exc:  # every failure of a request, whatever httpx adds under it
            raise _request_failed(f"{method} {self.url}{path}", exc) from exc
        if response.status_code == 204:
            return None
        decoded = _json_object(response)
        if decoded is not None and (response.is_success or response.status_code in accept):
            return decoded
        if response.is_success:
            raise _invalid_answer(f"{method} {self.url}{path}", response)
        raise _error_for(method, path, response, decoded)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _server_url(url: str) -> str:
    """The server's base URL without a trailing slash; ValueError for what cannot be one (before
    any request, which would report an unreachable server)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as error:
        raise ValueError(
            f"url {url!r} is not a URL ({error}): expected http://HOST:PORT or https://HOST:PORT"
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"url {url!r} is not a server's URL: expected http://HOST:PORT or https://HOST:PORT")
    return url.rstrip("/")


def _is_header_value(text: str) -> bool:
    """Visible ASCII and spaces only: what an HTTP header value may carry (no line break that would
    end the header)."""
    return all(" " <= character <= "~" for character in text)


def _request_failed(request: str, exc: httpx.HTTPError) -> errors.TxbrokerError:
    """The SDK's error for one of httpx's: no answer (a transport error), an answer that does not
    decode, or a redirect loop (which the SDK, following no redirect, cannot meet: for completeness)."""
    what = f"{type(exc).__name__}: {str(exc) or 'connection failed'}"
    if isinstance(exc, httpx.DecodingError):
        return errors.InvalidResponseError(
            f"{request}: the answer's body does not decode ({what}): its Content-Encoding was corrupted on the way, "
            f"or a proxy in between answered; the request may or may not have been applied (it is safe to retry, "
            f"as the SDK does); if this persists, check what stands between this client and the server"
        )
    if isinstance(exc, httpx.TooManyRedirects):
        return errors.InvalidResponseError(
            f"{request}: {what}: a txbroker server never redirects, so `url` names something else (a proxy or a "
            f"load balancer that redirects): use the server's own URL, http(s)://HOST:PORT",
            retriable=False,
        )
    return errors.TxbrokerConnectionError(  # connect, read, write, timeouts, protocol errors
        f"{request}: {what} (the request may or may not have been applied; it is safe to retry)"
    )


def _json_object(response: httpx.Response) -> dict | None:
    """The body as the contract's answers all are, a JSON object; None for any other body."""
    try:
        decoded = _loads(response.content) if response.content else None
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def _invalid_answer(request: str, response: httpx.Response) -> errors.InvalidResponseError:
    """A 2xx answer whose body is not a JSON object: not the contract's answer, and not its error either."""
    content_type = response.headers.get("Content-Type", "no Content-Type")
    body = f"{response.text[:200]!r}" if response.content else "an empty body"
    return errors.InvalidResponseError(
        f"{request} answered HTTP {response.status_code} ({content_type}) with {body}, where the contract answers a "
        f"JSON object: a proxy or another server answered; the request may or may not have been applied (it is "
        f"safe to retry, as the SDK does); if this persists, `url` does not reach a txbroker server's API",
        status=response.status_code,
    )


def _error_for(method: str, path: str, response: httpx.Response, decoded: Any) -> errors.TxbrokerError:
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        error = errors.from_body(decoded["error"], response.status_code)
    else:  # not a contract error body: a proxy, or not a txbroker server
        retriable = response.status_code >= 500
        error = errors.TxbrokerError(
            f"{method} {path} answered HTTP {response.status_code} without a txbroker error body: "
            f"{response.text[:200]!r}",
            code="UNKNOWN_SERVER_ERROR" if retriable else "INVALID_REQUEST",
            retriable=retriable,
            status=response.status_code,
        )
    retry_after = response.headers.get("Retry-After")
    if retry_after:
        try:
            error.retry_after_s = float(retry_after)
        except ValueError:
            pass
    return error
