"""Well-formed requests carrying extreme values: each advertised API and version's sample request
(test_api_versions.sample_request) with one field at a time set to an edge of its type (an
integer's minimum, -1, 0 and maximum; a string empty, of 32767 bytes, or not ASCII; null where the
field may be; an array empty, with its first entry twice, or a few thousand times). What each one
is answered with is an Outcome, for test_boundary_values.py to judge."""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import types
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from kio.schema.errors import ErrorCode as KafkaError
from kio.serial import entity_writer
from kio.serial.errors import OutOfBoundValue

from tests.kafka.raw import RawConnection, request_frame

INTEGER_EDGES = {
    "int8": (-(2**7), -1, 0, 2**7 - 1),
    "int16": (-(2**15), -1, 0, 2**15 - 1),
    "int32": (-(2**31), -1, 0, 2**31 - 1),
    "int64": (-(2**63), -1, 0, 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "timedelta_i32": (-(2**31), -1, 0, 2**31 - 1),
    # Python's timedelta holds no more than about 2^56 ms.
    "timedelta_i64": (-1, 0, 2**53),
}
LONGEST_STRING = "x" * 32767
NOT_ASCII = "ünïcødé-名前-✓"
STRING_EDGES = ("", LONGEST_STRING, NOT_ASCII)
MANY_ENTRIES = 3000
MANY_ENTRIES_LABEL = f"{MANY_ENTRIES} entries"


@dataclass(frozen=True)
class Mutation:
    path: str  # the field, as topics[0].partitions[0].index
    value: str  # what it was set to, shortly


@dataclass(frozen=True)
class Outcome:
    """An answer (the error codes in it), the connection closed, or no answer within the wait."""

    answered: bool
    errors: frozenset[KafkaError] = frozenset()
    closed: bool = False
    detail: str = ""


def mutations(request) -> Iterator[tuple[Mutation, object]]:
    """(what was changed, the changed request) for each field of `request` and each of its edges."""
    for path, field, value in _walk(request, ()):
        for label, edge in _edges(field, value):
            changed = _replaced(request, path, edge)
            if changed is not None and _writes(changed):
                yield Mutation(_render(path), label), changed


def _render(path: tuple) -> str:
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")


def _walk(message, path: tuple) -> Iterator[tuple[tuple, dataclasses.Field, object]]:
    """(path, field, value) of every field, nested ones too (an array's first entry's)."""
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        yield (*path, field.name), field, value
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            yield from _walk(value[0], (*path, field.name, 0))
        elif dataclasses.is_dataclass(value):
            yield from _walk(value, (*path, field.name))


def _nullable(field: dataclasses.Field) -> bool:
    annotation = field.type
    if isinstance(annotation, str):
        return "None" in annotation
    return type(None) in typing.get_args(annotation) or (
        isinstance(annotation, types.UnionType) and type(None) in annotation.__args__
    )


def _edges(field: dataclasses.Field, value) -> Iterator[tuple[str, object]]:
    kind = field.metadata.get("kafka_type")
    if isinstance(value, tuple):
        yield "[]", ()
        if value:
            yield "first twice", (value[0], *value)
            yield MANY_ENTRIES_LABEL, value[:1] * MANY_ENTRIES
        if _nullable(field):
            yield "null", None
        return
    if kind in INTEGER_EDGES:
        for edge in INTEGER_EDGES[kind]:
            yield str(edge), datetime.timedelta(milliseconds=edge) if kind.startswith("timedelta") else edge
    elif kind == "string":
        for edge in STRING_EDGES:
            yield (f"{len(edge)}-char string" if edge is LONGEST_STRING else repr(edge)), edge
    elif kind == "bytes":
        yield "b''", b""
    elif kind == "uuid":
        yield "zero uuid", uuid.UUID(int=0)
        yield "random uuid", uuid.UUID(int=0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0)
    elif kind == "bool":
        yield str(not value), not value
    if kind is not None and _nullable(field) and value is not None:
        yield "null", None


def _replaced(message, path: tuple, new):
    head, *rest = path
    if not rest:
        return dataclasses.replace(message, **{head: new})
    inner = getattr(message, head)
    if isinstance(rest[0], int):
        index, *rest = rest
        changed = _replaced(inner[index], tuple(rest), new) if rest else new
        return dataclasses.replace(message, **{head: (*inner[:index], changed, *inner[index + 1 :])})
    return dataclasses.replace(message, **{head: _replaced(inner, tuple(rest), new)})


def _writes(request) -> bool:
    """False for a value kio cannot write in this version (a null where the version has none)."""
    try:
        entity_writer(type(request))(io.BytesIO(), request)
    except (TypeError, ValueError, struct.error, OverflowError):
        return False
    return True


def send(bootstrap: str, request, wait_s: float, errors_of) -> Outcome:
    """The request's outcome on a connection of its own."""
    with RawConnection(bootstrap) as connection:
        connection.sock.settimeout(wait_s)
        try:
            connection.send_bytes(request_frame(request, 1))
            response = connection.receive(request.__api_key__, request.__version__, 1)
        except (TimeoutError, socket.timeout):
            return Outcome(answered=False, detail="no answer")
        except (ConnectionError, OSError) as closed:
            return Outcome(answered=False, closed=True, detail=str(closed))
        except AssertionError as unreadable:
            return Outcome(answered=False, detail=f"unreadable answer: {unreadable}")
        except OutOfBoundValue as beyond_kio:
            # kio reads no negative time, where Kafka answers -1 for none (DescribeTransactions'
            # start time of an id with no transaction open): an answer all the same.
            return Outcome(answered=True, detail=f"an answer kio cannot read: {beyond_kio}")
    return Outcome(answered=True, errors=frozenset(errors_of(response)), detail=_short(response))


def _short(response) -> str:
    text = repr(response)
    return text if len(text) < 400 else text[:400] + "..."
