"""The APIs this listener serves and their versions: what ApiVersions advertises and dispatch.py
accepts. Per API, from the lowest version the supported clients (librdkafka 2.x, kafka-python,
aiokafka) need to the highest implemented; tests/kafka/test_api_versions.py round-trips each.
Topic ids (KIP-516, migration 0009) in Metadata v10+, Fetch v13+, Produce v13, CreateTopics v7,
DeleteTopics v6.
"""

from __future__ import annotations

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
DELETE_GROUPS = 42
ELECT_LEADERS = 43
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_CONFIGS = 32
DESCRIBE_LOG_DIRS = 35
ALTER_REPLICA_LOG_DIRS = 34
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
ALTER_CONFIGS = 33
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
OFFSET_DELETE = 47
API_VERSIONS = 18
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
DESCRIBE_CLUSTER = 60
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
DESCRIBE_TOPIC_PARTITIONS = 75
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51

SUPPORTED_VERSIONS: dict[int, range] = {
    PRODUCE: range(3, 14),  # v3: the first with message format v2 (RecordBatch) and transactional ids; v13: topic ids
    FETCH: range(4, 19),  # v4: isolation_level and aborted transactions; v13+: topic ids
    LIST_OFFSETS: range(1, 11),  # v8: earliest local (-4); v9: latest tiered (-5); v10: a timeout
    METADATA: range(0, 14),  # v13: a top-level error code (KIP-1102's REBOOTSTRAP_REQUIRED), always none here
    OFFSET_COMMIT: range(2, 10),  # v9: KIP-848's (classic groups: GROUP_ID_NOT_FOUND for an unknown group)
    OFFSET_FETCH: range(1, 10),  # v9: KIP-848's member id and epoch, unused by classic groups
    FIND_COORDINATOR: range(0, 7),  # v5: TRANSACTION_ABORTABLE (never here); v6: share keys (not served)
    JOIN_GROUP: range(0, 10),
    HEARTBEAT: range(0, 5),
    LEAVE_GROUP: range(0, 6),
    SYNC_GROUP: range(0, 6),
    DESCRIBE_GROUPS: range(0, 7),  # v6: GROUP_ID_NOT_FOUND and error messages (KIP-1043)
    LIST_GROUPS: range(0, 6),  # v5: the group type filter (KIP-848): all are classic
    CREATE_TOPICS: range(2, 8),
    DELETE_TOPICS: range(1, 7),
    DELETE_RECORDS: range(0, 3),
    DELETE_GROUPS: range(0, 3),  # v2: flexible
    ELECT_LEADERS: range(0, 3),  # v1: the election type (KIP-460); v2: flexible
    DESCRIBE_ACLS: range(1, 4),  # v1: pattern types (KIP-290); v2: flexible
    CREATE_ACLS: range(1, 4),
    DELETE_ACLS: range(1, 4),
    DESCRIBE_CONFIGS: range(1, 5),
    DESCRIBE_LOG_DIRS: range(
        1, 6
    ),  # v0 as v1 (not in kio); v2: flexible; v3: an error code; v4: volume bytes; v5: cordoned
    ALTER_CONFIGS: range(0, 3),  # v2: flexible
    ALTER_REPLICA_LOG_DIRS: range(1, 3),  # v0 as v1 (not in kio); v2: flexible
    ALTER_PARTITION_REASSIGNMENTS: range(0, 2),  # v1: allow_replication_factor_change (KIP-860)
    LIST_PARTITION_REASSIGNMENTS: range(0, 1),
    CREATE_PARTITIONS: range(0, 4),
    INCREMENTAL_ALTER_CONFIGS: range(0, 2),
    OFFSET_DELETE: range(0, 1),
    API_VERSIONS: range(0, 5),  # v4: features of minimum 0 listed
    INIT_PRODUCER_ID: range(0, 6),  # v5: TRANSACTION_ABORTABLE known (KIP-890), never answered here
    ADD_PARTITIONS_TO_TXN: range(0, 4),  # v4+: the brokers' batched form (KIP-890), not a client's
    ADD_OFFSETS_TO_TXN: range(0, 5),  # v4: as InitProducerId v5
    END_TXN: range(0, 6),  # v5: transaction version 2 (KIP-890)
    TXN_OFFSET_COMMIT: range(0, 6),  # v3: generation and member (KIP-447); v4: as InitProducerId v5; v5: TV2
    SASL_HANDSHAKE: range(0, 2),  # v0: SASL's token then sent unframed (app/kafka/sasl.py)
    SASL_AUTHENTICATE: range(0, 3),
    DESCRIBE_CLUSTER: range(0, 3),  # v1: the endpoint type (KIP-919); v2: fenced brokers (KIP-1073), none here
    DESCRIBE_PRODUCERS: range(0, 1),
    DESCRIBE_TRANSACTIONS: range(0, 1),
    LIST_TRANSACTIONS: range(0, 3),  # v1: the duration filter; v2: the transactional id pattern (KIP-1152)
    DESCRIBE_TOPIC_PARTITIONS: range(0, 1),  # KIP-966: Metadata's topics by pages of partitions
    CONSUMER_GROUP_HEARTBEAT: range(0, 2),  # KIP-848; v1: the consumer generates its member id (librdkafka's)
    CONSUMER_GROUP_DESCRIBE: range(0, 2),  # KIP-848; v1: the member type (KIP-1099)
    DESCRIBE_USER_SCRAM_CREDENTIALS: range(0, 1),  # KIP-554: SCRAM credentials (handlers/scram.py)
    ALTER_USER_SCRAM_CREDENTIALS: range(0, 1),
}
