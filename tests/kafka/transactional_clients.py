"""Transactional producers of the real clients, behind one small interface: a test runs a sequence
of transactions (each a list of (partition, value) and whether to commit) with each client that
supports transactions (confluent-kafka, kafka-python, aiokafka), with the client's own
InitProducerId, AddPartitionsToTxn and EndTxn (each below v5: transaction version 1). Each
transaction's records are written before it ends, so an aborted one's are in the log, to be hidden."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from confluent_kafka import Producer

from tests.kafka.clients import WAIT_S, bootstrap


@dataclass(frozen=True)
class Transaction:
    records: list[tuple[int, bytes]]  # (partition, value)
    commit: bool


class ConfluentTransactions:
    name = "confluent-kafka"

    def run(self, server, transactional_id: str, topic: str, transactions: list[Transaction]) -> None:
        producer = Producer({"bootstrap.servers": bootstrap(server), "transactional.id": transactional_id})
        producer.init_transactions(WAIT_S)
        for transaction in transactions:
            producer.begin_transaction()
            for partition, value in transaction.records:
                producer.produce(topic, value=value, partition=partition)
            assert producer.flush(WAIT_S) == 0  # written before it ends (an abort would drop unsent ones)
            if transaction.commit:
                producer.commit_transaction(WAIT_S)
            else:
                producer.abort_transaction(WAIT_S)


class KafkaPythonTransactions:
    name = "kafka-python"

    def run(self, server, transactional_id: str, topic: str, transactions: list[Transaction]) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
        try:
            producer.init_transactions()
            for transaction in transactions:
                producer.begin_transaction()
                for partition, value in transaction.records:
                    producer.send(topic, value=value, partition=partition)
                producer.flush(WAIT_S)  # written before it ends (an abort would drop unsent ones)
                if transaction.commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
        finally:
            producer.close(WAIT_S)


class AioKafkaTransactions:
    name = "aiokafka"

    def run(self, server, transactional_id: str, topic: str, transactions: list[Transaction]) -> None:
        from aiokafka import AIOKafkaProducer

        async def run():
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
            await producer.start()
            try:
                for transaction in transactions:
                    await producer.begin_transaction()
                    for partition, value in transaction.records:
                        # Written before it ends (an abort would drop unsent ones).
                        await producer.send_and_wait(topic, value=value, partition=partition)
                    if transaction.commit:
                        await producer.commit_transaction()
                    else:
                        await producer.abort_transaction()
            finally:
                await producer.stop()

        asyncio.run(run())


TRANSACTIONAL_CLIENTS = [ConfluentTransactions(), KafkaPythonTransactions(), AioKafkaTransactions()]


# ---- consume-transform-produce with a consumer group, and a zombie fenced: kafka-python and aiokafka


# The loop's consumer (both clients take these names): offsets committed only with the transactions.
LOOP_CONSUMER = {"enable_auto_commit": False, "auto_offset_reset": "earliest", "isolation_level": "read_committed"}


@dataclass(frozen=True)
class LoopStep:
    """A transaction of the loop: the next `count` records of the source, written transformed to
    the sink with their offsets sent to the transaction; committed or aborted."""

    count: int
    commit: bool


class KafkaPythonLoop:
    name = "kafka-python"
    # The zombie's write after the fence, refused as a Kafka leader refuses an old epoch's Produce (`fenced`).
    fenced_error = "InvalidProducerEpochError"

    def run(self, server, group: str, source: str, sink: str, transactional_id: str, steps: list[LoopStep]) -> None:
        """A subscribed consumer (the group joined), its group metadata sent with the offsets
        (TxnOffsetCommit v3: the generation checked, KIP-447); after an abort the consumer seeks
        back to the last commit, as an application does."""
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        consumer = KafkaConsumer(bootstrap_servers=bootstrap(server), group_id=group, **LOOP_CONSUMER)
        producer = KafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
        try:
            assert consumer.partitions_for_topic(source)
            consumer.subscribe([source])
            producer.init_transactions()
            partition = TopicPartition(source, 0)
            for step in steps:
                records = []
                while len(records) < step.count:
                    for batch in consumer.poll(timeout_ms=200, max_records=step.count - len(records)).values():
                        records.extend(batch)
                producer.begin_transaction()
                for record in records:
                    producer.send(sink, value=b"t-" + record.value, partition=0)
                producer.flush(WAIT_S)  # written before it ends (an abort would drop unsent ones)
                next_offset = records[-1].offset + 1
                producer.send_offsets_to_transaction(
                    {partition: OffsetAndMetadata(next_offset, "", -1)}, consumer.group_metadata()
                )
                if step.commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
                    consumer.seek(partition, records[0].offset)
        finally:
            producer.close(WAIT_S)
            consumer.close()

    def fenced(self, server, transactional_id: str, topic: str) -> Exception:
        """The error the zombie gets once a new instance with its transactional id started."""
        from kafka import KafkaProducer

        zombie = KafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
        successor = KafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
        try:
            zombie.init_transactions()
            zombie.begin_transaction()
            zombie.send(topic, value=b"zombie-1", partition=0).get(WAIT_S)
            successor.init_transactions()
            successor.begin_transaction()
            successor.send(topic, value=b"successor-1", partition=0)
            successor.commit_transaction()
            try:
                # Waited for before the commit, which it raises (INVALID_PRODUCER_EPOCH, as Kafka's leader
                # answers an old epoch's Produce). Not waited for, the write and the commit raced: kafka-python
                # answers the refused write by bumping its epoch, and a commit sent meanwhile failed on its own
                # state machine ("Invalid transition attempted from state BUMPING_PRODUCER_EPOCH"), else with
                # the server's PRODUCER_FENCED (ProducerFencedError): once in many runs the former.
                zombie.send(topic, value=b"zombie-2", partition=0).get(WAIT_S)
                zombie.commit_transaction()
            except Exception as refused:  # the client's own error, checked by the test
                return refused
            raise AssertionError("the zombie committed after a new instance fenced it")
        finally:
            successor.close(WAIT_S)
            zombie.close(0)


class AioKafkaLoop:
    name = "aiokafka"
    fenced_error = "ProducerFenced"

    def run(self, server, group: str, source: str, sink: str, transactional_id: str, steps: list[LoopStep]) -> None:
        """A subscribed consumer (the group joined); aiokafka sends the group id alone
        (TxnOffsetCommit v0, no generation check, as Kafka accepts)."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        async def run():
            consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap(server), group_id=group, **LOOP_CONSUMER)
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
            await consumer.start()
            await producer.start()
            try:
                partition = TopicPartition(source, 0)
                for step in steps:
                    records = []
                    while len(records) < step.count:
                        found = await consumer.getmany(timeout_ms=200, max_records=step.count - len(records))
                        for batch in found.values():
                            records.extend(batch)
                    await producer.begin_transaction()
                    for record in records:
                        await producer.send_and_wait(sink, value=b"t-" + record.value, partition=0)
                    await producer.send_offsets_to_transaction({partition: records[-1].offset + 1}, group)
                    if step.commit:
                        await producer.commit_transaction()
                    else:
                        await producer.abort_transaction()
                        consumer.seek(partition, records[0].offset)
            finally:
                await producer.stop()
                await consumer.stop()

        asyncio.run(run())

    def fenced(self, server, transactional_id: str, topic: str) -> Exception:
        from aiokafka import AIOKafkaProducer

        async def run():
            zombie = AIOKafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
            successor = AIOKafkaProducer(bootstrap_servers=bootstrap(server), transactional_id=transactional_id)
            await zombie.start()
            try:
                await zombie.begin_transaction()
                await zombie.send_and_wait(topic, value=b"zombie-1", partition=0)
                await successor.start()  # InitProducerId: fences the zombie
                await successor.begin_transaction()
                await successor.send_and_wait(topic, value=b"successor-1", partition=0)
                await successor.commit_transaction()
                try:
                    await zombie.send_and_wait(topic, value=b"zombie-2", partition=0)
                    await zombie.commit_transaction()
                except Exception as refused:  # the client's own error, checked by the test
                    return refused
                raise AssertionError("the zombie committed after a new instance fenced it")
            finally:
                await successor.stop()
                await zombie.stop()

        return asyncio.run(run())


LOOP_CLIENTS = [KafkaPythonLoop(), AioKafkaLoop()]
