"""One HTTP connection pool to one txbroker server, speaking the contract (docs/api.md): JSON bodies in,
JSON bodies out, error bodies turned into `txbroker.errors` exceptions.

This is the single boundary where httpx's exceptions become the SDK's (`raise ... from`): a
transport failure is a `TxbrokerConnectionError` (retriable: the outcome is unknown, and every
state-changing request of the contract is safe to retry with the same body); an answer that is not
the contract's (a 2xx whose body is not a JSON object, a body that does not decode) is an
`InvalidResponseError`, one of them (its outcome is unknown too); an error response is the class of
its code. Nothing above this module sees httpx, nor an answer that is not a JSON object.

An answer is an `Answer`: a dict whose fields, and the objects and lists in them, check what the
SDK reads. A field the contract's answer always holds but this one lacks, or holds with another
type (a proxy's or another version's JSON), is an `InvalidResponseError` naming the request and the
field where it is read, instead of a KeyError or TypeError deep in a reader (a consumer's poll(),
its heartbeat task, init_transactions()). What a caller reads of an answer it reads with `read=`,
inside the attempt its retry loop repeats: such an answer is then retried as a lost one is.

The transport is pluggable (`transport=`): an `httpx.AsyncBaseTransport` such as
`httpx.MockTransport` or `httpx.ASGITransport(app)`, or a synchronous `httpx.BaseTransport`, which
is run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

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
T = TypeVar("T")
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
        read: Callable[[Answer], T] | None = None,
    ) -> Any:
        """The decoded JSON object of the response (None for 204), or `read(answer)` when given;
        raises the error class of an error response (unless its status is in `accept`),
        TxbrokerConnectionError when no response arrived, InvalidResponseError when the one that
        did is not the contract's.

        `read` is what the caller reads of the answer: read here, within the attempt that a caller's
        retry loop (txbroker.retry.retrying, the sender's) repeats, an answer lacking a field it
        reads, or holding one of another type, is retried as one that is not JSON is, within the
        same bounds. Read after that loop returned, it could only fail the call. A reader reads the
        fields it needs, not every record of a fetch (those are read lazily: AnswerList.read_each)."""
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
            # No fields: a reader that reads one finds it missing (a 204 where the contract answers them).
            return None if read is None else read(Answer({}, f"{method} {self.url}{path}"))
        decoded = _json_object(response)
        if decoded is not None and (response.is_success or response.status_code in accept):
            answer = Answer(decoded, f"{method} {self.url}{path}")
            return answer if read is None else read(answer)
        if response.is_success:
            raise _invalid_answer(f"{method} {self.url}{path}", response)
        raise _error_for(method, path, response, decoded)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


# The contract's answer fields the SDK reads, by name (a name means the same in every answer), and
# the JSON types they have (docs/api.md): exact types, as JSON decodes (a boolean is no integer). A
# field not named here is checked for presence only.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(
        (
            "producer_id",
            "producer_epoch",
            "generation_id",
            "partition",
            "offset",
            "next_offset",
            "low_watermark",
            "timestamp_ms",
        ),
        (int,),
    ),
    **dict.fromkeys(("base_offset", "heartbeat_interval_ms"), (int, type(None))),
    **dict.fromkeys(("topic", "member_id", "transactional_id", "state", "code"), (str,)),
    **dict.fromkeys(("key", "value", "metadata", "topic_id"), (str, type(None))),
    **dict.fromkeys(("partitions", "records", "assignment", "offsets", "transactions"), (list,)),
    "headers": (list, type(None)),
    "error": (dict, type(None)),
}
_JSON_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}

# Where an object or array sits in its answer: (the parent's place, its field name or index), ()
# for the answer itself; spelled out ("partitions[0].records") only for an error's message.
_Place = tuple


class Answer(dict):
    """A decoded answer of `request`: reading a field it lacks, or one whose JSON type is not the
    contract's, raises InvalidResponseError; the objects and arrays read from it are checked alike.
    `get()` is for optional fields. Pickled and copied as the plain dict it holds."""

    __slots__ = ("request", "place")

    def __init__(self, fields: dict, request: str, place: _Place = ()) -> None:
        super().__init__(fields)
        self.request, self.place = request, place

    def __getitem__(self, field: str) -> Any:
        try:
            value = dict.__getitem__(self, field)
        except KeyError:
            raise _field_error(self, field, "is missing, which the contract's answer holds") from None
        expected = _FIELD_TYPES.get(field)
        if expected is not None and type(value) not in expected:
            wanted = " or ".join(_JSON_NAMES[t] for t in expected)
            actual = _JSON_NAMES.get(type(value), type(value).__name__)
            raise _field_error(self, field, f"is {actual} where the contract's answer holds {wanted}")
        kind = type(value)
        if kind is dict:
            return Answer(value, self.request, (self.place, field))
        if kind is list:
            return AnswerList(value, self.request, (self.place, field))
        return value

    def get(self, field: str, default: Any = None) -> Any:
        return self[field] if field in self else default

    def __reduce__(self):
        return dict, (dict(self),)


class AnswerList(list):
    """An array of an Answer: the objects and arrays in it are checked as the Answer's are."""

    __slots__ = ("request", "place")

    def __init__(self, items: list, request: str, place: _Place) -> None:
        super().__init__(items)
        self.request, self.place = request, place

    def __getitem__(self, index):
        item = list.__getitem__(self, index)
        if isinstance(index, slice):
            return AnswerList(item, self.request, self.place)
        return self._checked(item, index)

    def __iter__(self):
        request, place = self.request, self.place
        for index, item in enumerate(list.__iter__(self)):
            kind = type(item)
            if kind is dict:
                yield Answer(item, request, (place, index))
            elif kind is list:
                yield AnswerList(item, request, (place, index))
            else:
                yield item

    def read_each(self, read: Callable[[Any], T]) -> Iterator[T]:
        """read(item) of each item, at a plain list's speed (a fetch's records: checking every
        field of every record would double the cost of reading them). The item is checked only
        when `read` fails on it (KeyError, TypeError, ValueError), to say which of its fields was
        not the contract's: an InvalidResponseError, as reading a checked item raises."""
        for index, item in enumerate(list.__iter__(self)):
            try:
                yield read(item)
            except (KeyError, TypeError, ValueError) as error:
                raise self._unreadable(index, read, error) from error

    def _unreadable(self, index: int, read: Callable[[Any], Any], error: Exception) -> errors.InvalidResponseError:
        try:
            read(self._checked(list.__getitem__(self, index), index))
        except errors.InvalidResponseError as found:
            return found
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        return _invalid_field(
            self.request, _spelled((self.place, index)), f"could not be read ({type(error).__name__}: {error})"
        )

    def _checked(self, item: Any, index: int) -> Any:
        if type(item) is dict:
            return Answer(item, self.request, (self.place, index))
        if type(item) is list:
            return AnswerList(item, self.request, (self.place, index))
        return item

    def __reduce__(self):
        return list, (list(list.__iter__(self)),)


def _spelled(place: _Place) -> str:
    """("partitions", 0), "records" -> "partitions[0].records"."""
    if not place:
        return ""
    parent, name = place
    before = _spelled(parent)
    if isinstance(name, int):
        return f"{before}[{name}]"
    return f"{before}.{name}" if before else name


def _field_error(answer: Answer, field: str, problem: str) -> errors.InvalidResponseError:
    return _invalid_field(answer.request, _spelled((answer.place, field)), problem)


def _invalid_field(request: str, field: str, problem: str) -> errors.InvalidResponseError:
    return errors.InvalidResponseError(
        f"{request} answered a JSON object whose field {field!r} {problem} "
        f"(docs/api.md): a proxy or a server of another txbroker version answered; the request may or may not "
        f"have been applied (it is safe to retry, as the SDK does); if this persists, check that `url` reaches a "
        f"txbroker server whose version this SDK speaks"
    )


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
        # Raised as the class of its code, so that `except InvalidRequestError` (a proxy's 413, an
        # auth proxy's 401) and `except UnknownServerError` (a gateway's 502) catch it as they catch
        # the server's own; before, it was the base TxbrokerError with that code.
        retriable = response.status_code >= 500
        error = errors.from_body(
            {
                "code": "UNKNOWN_SERVER_ERROR" if retriable else "INVALID_REQUEST",
                "message": f"{method} {path} answered HTTP {response.status_code} without a txbroker error body: "
                f"{response.text[:200]!r}",
                "retriable": retriable,
            },
            response.status_code,
        )
    retry_after = response.headers.get("Retry-After")
    if retry_after:
        try:
            error.retry_after_s = float(retry_after)
        except ValueError:
            pass
    return error
