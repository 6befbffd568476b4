"""InitProducerId: an idempotent producer's id and epoch (or a transactional id's, through the same
coordinator HTTP's POST /v1/producers/init uses)."""

from __future__ import annotations

import datetime

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.context import RequestContext
from app.kafka.error_codes import versioned_error
from app.kafka.frames import build, response_module

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# InitProducerId v4+ answers PRODUCER_FENCED (KIP-588); older versions INVALID_PRODUCER_EPOCH.
PRODUCER_FENCED_SINCE = 4


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.INIT_PRODUCER_ID, context.api_version)
    timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
    error = None
    try:
        producer_id, epoch = await context.calls.init_producer_id(
            context.principal,
            request.transactional_id,
            timeout_ms,
            getattr(request, "producer_id", NO_PRODUCER_ID),
            getattr(request, "producer_epoch", NO_PRODUCER_EPOCH),
        )
    except BrokerError as raised:
        error, producer_id, epoch = raised, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
    return build(
        module,
        "InitProducerIdResponse",
        throttle_time=datetime.timedelta(0),
        error_code=versioned_error(error, context.api_version, PRODUCER_FENCED_SINCE),
        producer_id=producer_id,
        producer_epoch=epoch,
    )
