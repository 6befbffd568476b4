"""txbroker's Python SDK: Apache Kafka's transactional messaging (KIP-98) over txbroker's HTTP API.

    from txbroker import Producer, Consumer, Admin, TopicPartition

Synchronous clients (`Producer`, `Consumer`, `Admin`, `TwoPhaseClient`) and asyncio ones
(`AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`, `AsyncTwoPhaseClient`) share one implementation,
the asyncio one. The SDK needs httpx alone.
"""

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
