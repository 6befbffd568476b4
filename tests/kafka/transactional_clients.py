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
