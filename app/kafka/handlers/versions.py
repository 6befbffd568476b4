"""ApiVersions: which APIs and versions this listener serves (api_table.py)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.frames import build, response_module

# A version this broker does not know is answered with v0's layout, which every client reads
# (Kafka's ApiVersionsRequest fallback).
FALLBACK_VERSION = 0


def response(version: int, error: KafkaError) -> object:
    module = response_module(api_table.API_VERSIONS, version)
    keys = tuple(
        build(module, "ApiVersion", api_key=key, min_version=versions.start, max_version=versions.stop - 1)
        for key, versions in sorted(api_table.SUPPORTED_VERSIONS.items())
    )
    return build(
        module,
        "ApiVersionsResponse",
        error_code=error,
        api_keys=keys,
        throttle_time=datetime.timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


async def handle(context, request) -> object:
    return response(context.api_version, KafkaError.none)


def unsupported_version() -> object:
    return response(FALLBACK_VERSION, KafkaError.unsupported_version)
