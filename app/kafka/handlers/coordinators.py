"""FindCoordinator, minimal: this node coordinates every transactional id and every group (one node;
several nodes' coordinators are the consumer-groups slice of issue 23, which replaces this module)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.context import NODE_ID, RequestContext
from app.kafka.frames import build, response_module

# v4 (KIP-699) asks for several keys at once.
BATCHED_SINCE = 4


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.FIND_COORDINATOR, context.api_version)
    here = dict(node_id=NODE_ID, host=context.advertised_host, port=context.advertised_port)
    if context.api_version < BATCHED_SINCE:
        return build(
            module,
            "FindCoordinatorResponse",
            throttle_time=datetime.timedelta(0),
            error_code=KafkaError.none,
            error_message=None,
            **here,
        )
    return build(
        module,
        "FindCoordinatorResponse",
        throttle_time=datetime.timedelta(0),
        coordinators=tuple(
            build(module, "Coordinator", key=key, error_code=KafkaError.none, error_message=None, **here)
            for key in request.coordinator_keys
        ),
    )
