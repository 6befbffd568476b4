"""Kafka's framing and headers around kio's generated messages (never hand-written schemas).

A frame is a 4-byte big-endian length then the message. A request is a request header (v2 for
the flexible versions of an API, else v1) then the API's request; a response is a response header
(v1 for flexible versions, else v0; ApiVersions always v0, so that a client that sent a version
the broker does not know can still read the answer) then the response.
"""

from __future__ import annotations

import functools
import io
import struct
import types
import typing
from dataclasses import dataclass, fields
from types import ModuleType

from kio.index import UnknownAPIKey, UnknownEntity, load_payload_module, load_request_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

FRAME_LENGTH = struct.Struct(">i")
# PostgreSQL's text cannot hold NUL, so a request naming a group, member, transactional id, ... with
# one cannot be served: its connection is closed (never an error inside the node). Offsets' metadata
# keeps its NULs, as Kafka does (confluent-kafka's Python binding ends it with one; storage writes
# them in a form text holds: app/storage/groups/offset_metadata.py), and Produce's and Fetch's
# names are only ever looked up (a name with NUL matches no topic), so their walk is skipped.
_NUL_ANSWERED_BY_HANDLER = frozenset({"committed_metadata"})
_NUL_UNCHECKED_APIS = frozenset({0, 1})
_TEXT = "string"  # kio's kafka_type of text fields (a nested message's fields have none)
# api_key, api_version, correlation_id: the same first fields in every request header version.
_HEADER_START = struct.Struct(">hhi")
API_VERSIONS_KEY = 18
# The longest string a non-flexible version can carry (an int16 length, in UTF-8 bytes). An error
# message quoting a long request value (a topic name of 32767 bytes) is cut to fit, so that its
# response can be written at all.
LONGEST_STRING_BYTES = 2**15 - 1
_CUT_MARK = "..."


class MalformedRequest(Exception):
    """A frame that is not a request of a known API and version: the connection is closed, as Kafka does."""


class CloseConnection(Exception):
    """A request Kafka's broker answers by closing the connection once the answers before it are
    written: a Produce with acks=0 that failed, so that its client, which reads no answer, notices
    and refreshes its metadata; a read the synchronous standby has not confirmed, for an API whose
    clients retry no error code of its answer (error_codes.closed_when_unconfirmed)."""


@dataclass(frozen=True, slots=True)
class RequestFrame:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # None when the version is one this broker has no schema for (only ApiVersions answers those).
    body: object | None


# kio finds a schema by resolving its dotted name (an import lookup) on every call: the few there are
# are kept, as kio's own readers and writers are.
@functools.cache
def response_module(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.response)


@functools.cache
def _request_schema(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@functools.cache
def _field_names(message_class: type) -> frozenset[str]:
    return frozenset(field.name for field in fields(message_class))


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id), readable whatever the version."""
    if len(frame) < _HEADER_START.size:
        raise MalformedRequest(f"a frame of {len(frame)} bytes is shorter than a request header")
    return _HEADER_START.unpack_from(frame)


def parse_request(frame: bytes, known_versions: range | None) -> RequestFrame:
    """The frame's header and request. `known_versions`: those of the API this broker serves (None:
    an API it does not serve). A version outside them is parsed no further than its header."""
    api_key, api_version, correlation_id = peek_header(frame)
    if known_versions is None or api_version not in known_versions:
        return RequestFrame(api_key, api_version, correlation_id, None, None)
    try:
        body_class = _request_schema(api_key, api_version)
        header_class = RequestHeaderV2 if body_class.__flexible__ else RequestHeaderV1
        header, header_size = entity_reader(header_class)(frame, 0)
        body, body_size = entity_reader(body_class)(frame, header_size)
    except (UnknownAPIKey, UnknownEntity) as error:
        raise MalformedRequest(f"api key {api_key} version {api_version} has no schema: {error}") from error
    except Exception as error:  # kio's readers raise whatever a truncated or garbled buffer leads to
        raise MalformedRequest(
            f"api key {api_key} version {api_version}: the request does not parse ({error!r})"
        ) from error
    flaw = None if api_key in _NUL_UNCHECKED_APIS else _flaw(body)
    if flaw is not None:
        raise MalformedRequest(f"api key {api_key} version {api_version}: {flaw}")
    # Bytes after the request are ignored, as Kafka's brokers do: librdkafka 2.x sends Metadata v12
    # for every topic (AdminClient.list_topics) with 3 bytes more than the schema has.
    return RequestFrame(api_key, api_version, correlation_id, header.client_id, body)


def _flaw(value) -> str | None:
    """Why a parsed request cannot be served, or None: a text field with a NUL, or a null where the
    schema allows none (kio reads a null array or string whatever its schema says; Kafka's readers
    refuse it, and a handler would iterate it)."""
    if isinstance(value, str):
        return "a text field contains a NUL character" if "\0" in value else None
    if isinstance(value, tuple):
        return next(filter(None, map(_flaw, value)), None)
    if hasattr(value, "__dataclass_fields__"):
        for name, nullable, walked in _checked_fields(type(value)):
            item = getattr(value, name)
            if item is None:
                if not nullable:
                    return f"{type(value).__name__}.{name} is null, which its schema does not allow"
            elif walked:
                flaw = _flaw(item)
                if flaw is not None:
                    return flaw
    return None


@functools.cache
def _checked_fields(message_class: type) -> tuple[tuple[str, bool, bool], ...]:
    """(name, nullable, walked) of the fields of a message class `_flaw` checks: kio's strings and
    arrays of strings (kafka_type "string") and nested messages (none), walked for NUL, and arrays of
    numbers, only checked for null; never numbers, bytes, records or uuids."""
    checked = []
    for field in fields(message_class):
        if field.name in _NUL_ANSWERED_BY_HANDLER:
            continue
        text = field.metadata.get("kafka_type", _TEXT) == _TEXT
        if text or typing.get_origin(field.type) is tuple:
            nullable = isinstance(field.type, types.UnionType) and type(None) in typing.get_args(field.type)
            checked.append((field.name, nullable, text))
    return tuple(checked)


def encode_response(api_key: int, correlation_id: int, response: object) -> bytes:
    """The response's frame, length prefix included."""
    flexible = type(response).__flexible__ and api_key != API_VERSIONS_KEY
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    if flexible:
        entity_writer(ResponseHeaderV1)(buffer, ResponseHeaderV1(correlation_id=correlation_id))
    else:
        entity_writer(ResponseHeaderV0)(buffer, ResponseHeaderV0(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    FRAME_LENGTH.pack_into(frame, 0, len(frame) - FRAME_LENGTH.size)
    return bytes(frame)


def build(module: ModuleType, class_name: str, **values) -> object:
    """An instance of the version's message class `class_name`, from the values its version has
    (a handler passes the union of every version's fields; each version takes its own)."""
    message_class = getattr(module, class_name)
    names = _field_names(message_class)
    if isinstance(values.get("error_message"), str):
        values["error_message"] = _fitting(values["error_message"])
    return message_class(**{name: value for name, value in values.items() if name in names})


def _fitting(message: str) -> str:
    """`message`, cut (on a character) to LONGEST_STRING_BYTES in UTF-8 when longer."""
    encoded = message.encode()
    if len(encoded) <= LONGEST_STRING_BYTES:
        return message
    room = LONGEST_STRING_BYTES - len(_CUT_MARK)
    return encoded[:room].decode(errors="ignore") + _CUT_MARK
