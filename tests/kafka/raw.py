"""Raw Kafka requests over a socket, built and read with kio: what a test sends when it must
control every field (versions, sequences, epochs, malformed frames)."""

from __future__ import annotations

import io
import socket
import struct

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from app.kafka import api_table
from app.kafka.frames import build, response_module
from app.kafka.record_batches import KafkaRecord

API_VERSIONS = 18
TIMEOUT_S = 60


def request_class(api_key: int, version: int):
    return load_request_schema(api_key, version)


def request_of(api_key: int, version: int, **values):
    """The version's request from the union of every version's fields (each version takes its own)."""
    cls = request_class(api_key, version)
    return build(__import__(cls.__module__, fromlist=["_"]), cls.__name__, **values)


def nested(api_key: int, version: int, class_name: str, **values):
    cls = request_class(api_key, version)
    return build(__import__(cls.__module__, fromlist=["_"]), class_name, **values)


def request_frame(request, correlation_id: int = 1, client_id: str = "raw-test") -> bytes:
    header_class = RequestHeaderV2 if request.__flexible__ else RequestHeaderV1
    buffer = io.BytesIO()
    entity_writer(header_class)(
        buffer,
        header_class(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(type(request))(buffer, request)
    body = buffer.getvalue()
    return struct.pack(">i", len(body)) + body


class RawConnection:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exactly(self, count: int) -> bytes:
        chunks = b""
        while len(chunks) < count:
            chunk = self.sock.recv(count - len(chunks))
            if not chunk:
                raise ConnectionError(f"closed after {len(chunks)} of {count} bytes")
            chunks += chunk
        return chunks

    def closed_by_peer(self) -> bool:
        """True once the broker has closed the connection (reads end of stream)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def send(self, request) -> int:
        self.correlation_id += 1
        self.send_bytes(request_frame(request, self.correlation_id))
        return self.correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int, response_class=None):
        (length,) = struct.unpack(">i", self.read_exactly(4))
        frame = self.read_exactly(length)
        response_class = response_class or load_response_schema(api_key, version)
        flexible = response_class.__flexible__ and api_key != API_VERSIONS
        header, offset = entity_reader(ResponseHeaderV1 if flexible else ResponseHeaderV0)(frame, 0)
        assert header.correlation_id == correlation_id
        body, size = entity_reader(response_class)(frame, offset)
        assert offset + size == len(frame), "the response has trailing bytes"
        return body

    def call(self, request):
        correlation_id = self.send(request)
        return self.receive(request.__api_key__, request.__version__, correlation_id)


def topic_metadata(bootstrap: str, topic: str, allow_auto_topic_creation: bool):
    """Metadata v12's answer for one topic named by name."""
    with RawConnection(bootstrap) as connection:
        request = request_of(
            api_table.METADATA,
            12,
            topics=(nested(api_table.METADATA, 12, "MetadataRequestTopic", name=topic, topic_id=None),),
            allow_auto_topic_creation=allow_auto_topic_creation,
            include_topic_authorized_operations=False,
        )
        [answer] = connection.call(request).topics
    return answer


def response_class_of(api_key: int, version: int):
    return load_response_schema(api_key, version)


def record_batch(
    records: list[KafkaRecord],
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
) -> bytes:
    """A produced batch as a client builds it (kafka.record's builder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, is_transactional, producer_id, epoch, base_sequence, 2**30)
    for index, record in enumerate(records):
        builder.append(index, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


def by_topic(partitions: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each topic's partition indexes, the topics in the order first named."""
    found: dict[str, list[int]] = {}
    for topic, index in partitions:
        found.setdefault(topic, []).append(index)
    return found


__all__ = ["RawConnection", "by_topic", "record_batch", "request_of", "nested", "response_module"]
