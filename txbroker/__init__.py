"""txbroker's Python SDK: Apache Kafka's transactional messaging (KIP-98) over txbroker's HTTP API.

    from txbroker import Producer, Consumer, Admin, TopicPartition

Synchronous clients (`Producer`, `Consumer`, `Admin`) and asyncio ones (`AsyncProducer`,
`AsyncConsumer`, `AsyncAdmin`) share one implementation, the asyncio one. The SDK needs httpx alone.
"""

from txbroker.admin import AsyncAdmin
from txbroker.consumer import AsyncConsumer
from txbroker.errors import TxbrokerError, for_code
from txbroker.producer import AsyncProducer
from txbroker.records import (ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, RecordMetadata,
                              TopicPartition)
from txbroker.sync import Admin, Consumer, Producer
from txbroker.transaction_manager import TransactionState

__all__ = [
    "Admin", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Consumer", "ConsumerGroupMetadata", "ConsumerRecord",
    "OffsetAndMetadata", "Producer", "RecordMetadata", "TopicPartition", "TransactionState", "TxbrokerError",
    "for_code",
]
