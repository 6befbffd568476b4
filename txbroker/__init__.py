"""txbroker's Python SDK: Apache Kafka's transactional messaging (KIP-98) over txbroker's HTTP API.

    from txbroker import Producer, Consumer, Admin, TopicPartition

Synchronous clients (`Producer`, `Consumer`, `Admin`, `TwoPhaseClient`) and asyncio ones
(`AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`, `AsyncTwoPhaseClient`) share one implementation,
the asyncio one. The SDK needs httpx alone.

The clients are imported when first named (`from txbroker import Producer`), not with the package:
whoever imports one module of it (the server imports txbroker.wire, the facts of the wire both sides
share) does not load httpx and every client with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txbroker.admin import AsyncAdmin
    from txbroker.consumer import AsyncConsumer
    from txbroker.errors import TxbrokerError, for_code
    from txbroker.producer import AsyncProducer
    from txbroker.records import (
        ConsumerGroupMetadata,
        ConsumerRecord,
        OffsetAndMetadata,
        PreparedTransaction,
        RecordMetadata,
        TopicPartition,
    )
    from txbroker.sync import Admin, Consumer, Producer, TwoPhaseClient
    from txbroker.transaction_manager import TransactionState
    from txbroker.two_phase import AsyncTwoPhaseClient

# Each public name (__all__) and the module that defines it.
_MODULE_OF = {
    "Admin": "txbroker.sync",
    "AsyncAdmin": "txbroker.admin",
    "AsyncConsumer": "txbroker.consumer",
    "AsyncProducer": "txbroker.producer",
    "AsyncTwoPhaseClient": "txbroker.two_phase",
    "Consumer": "txbroker.sync",
    "ConsumerGroupMetadata": "txbroker.records",
    "ConsumerRecord": "txbroker.records",
    "OffsetAndMetadata": "txbroker.records",
    "PreparedTransaction": "txbroker.records",
    "Producer": "txbroker.sync",
    "RecordMetadata": "txbroker.records",
    "TopicPartition": "txbroker.records",
    "TransactionState": "txbroker.transaction_manager",
    "TwoPhaseClient": "txbroker.sync",
    "TxbrokerError": "txbroker.errors",
    "for_code": "txbroker.errors",
}

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncTwoPhaseClient",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "OffsetAndMetadata",
    "PreparedTransaction",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "TransactionState",
    "TwoPhaseClient",
    "TxbrokerError",
    "for_code",
]


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use (PEP 562) and kept."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'txbroker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
