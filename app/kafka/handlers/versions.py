"""ApiVersions: which APIs and versions this listener serves (api_table.py)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.frames import build, response_module

# A version this broker does not know is answered with v0's layout, which every client reads
# (Kafka's ApiVersionsRequest fallback).
FALLBACK_VERSION = 0
# Kafka's transaction.version feature: 2 is KIP-890's epoch bump per transaction, which EndTxn v5+
# gets (handlers/transactions.py); older EndTxn versions keep version 1's behaviour, as Kafka does.
TRANSACTION_VERSION_FEATURE = "transaction.version"
TRANSACTION_VERSION_MIN = 0
TRANSACTION_VERSION = 2
# The features never change on this broker: one epoch of them.
FEATURES_EPOCH = 1
# Below v4 a supported feature whose minimum is 0 is left out, as Kafka leaves it out (KAFKA-17011,
# KAFKA-17492: older clients fail to read such a range); v4 lists it. Finalized levels are unchanged.
FEATURE_MIN_ZERO_SINCE = 4


def _features(module, class_name: str, **levels) -> tuple:
    """The transaction.version feature, in the versions that carry features (v3+)."""
    if not hasattr(module, class_name):
        return ()
    return (build(module, class_name, name=TRANSACTION_VERSION_FEATURE, **levels),)


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
        supported_features=(
            _features(
                module, "SupportedFeatureKey", min_version=TRANSACTION_VERSION_MIN, max_version=TRANSACTION_VERSION
            )
            if TRANSACTION_VERSION_MIN > 0 or version >= FEATURE_MIN_ZERO_SINCE
            else ()
        ),
        finalized_features_epoch=FEATURES_EPOCH,
        finalized_features=_features(
            module, "FinalizedFeatureKey", max_version_level=TRANSACTION_VERSION, min_version_level=TRANSACTION_VERSION
        ),
        zk_migration_ready=False,
    )


async def handle(context, request) -> object:
    return response(context.api_version, KafkaError.none)


def unsupported_version() -> object:
    return response(FALLBACK_VERSION, KafkaError.unsupported_version)
