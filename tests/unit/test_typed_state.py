"""The coordinator's state is a TransactionState from the row on (issue 14's first bullet): the
workers' claim queries come from the state machine's predicates, and a change that keeps the state
cannot smuggle a state change past the checked transition (the metadata changes only through its
typed transitions: tests/unit/test_transaction_metadata.py)."""

from __future__ import annotations

from app.coordinator.transaction_coordinator import TransactionCoordinator, _states_where
from app.coordinator.transaction_metadata import TransactionMetadata
from app.coordinator.transaction_states import VALID_PREVIOUS_STATES, TransactionState
from app.settings import Settings

S = TransactionState


def test_claim_states_come_from_the_state_machine():
    assert _states_where(lambda state: state.is_decided) == ["PrepareCommit", "PrepareAbort"]
    assert set(_states_where(lambda state: state.may_expire)) == {s.value for s in VALID_PREVIOUS_STATES[S.DEAD]}
    assert not any(S(name).is_open for name in _states_where(lambda state: state.may_expire))


def test_the_log_reads_rows_as_the_coordinators_metadata():
    coordinator = TransactionCoordinator(pool=None, settings=Settings(database_url="postgresql://unused/db"))
    assert coordinator.log._row_type is TransactionMetadata
    assert coordinator.log._parse_state("Prepared") is S.PREPARED


def test_the_state_is_typed_when_read(server):
    import asyncio

    from app.storage.database import create_pool

    client = server.client
    client.post("/v1/producers/init", json={"transactional_id": "typed", "transaction_timeout_ms": 1000})

    async def read():
        pool = await create_pool(server.database_url, 1)
        try:
            return await TransactionCoordinator(pool, server.settings).describe("typed")
        finally:
            await pool.close()

    meta = asyncio.run(read())
    assert type(meta.state) is TransactionState and meta.state is S.EMPTY
