"""Kafka 4.0's group configs (KIP-848): a group's own `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms`, set, described and deleted by Kafka's IncrementalAlterConfigs,
AlterConfigs and DescribeConfigs on a GROUP resource, for a group that need not exist yet. A config
the group does not set is the server's (`group_consumer_session_timeout_ms`,
`group_consumer_heartbeat_interval_ms`). Its KIP-848 consumer-protocol members take the group's
values at each heartbeat (consumer_groups.py): the interval answered, and the session timeout their
eviction counts.

Validated as Kafka's broker validates a group's configs (GroupConfig.validate), on the group's
configs as they would be, every error INVALID_CONFIG: a name that is not one of them ("Unknown group
config name"; Kafka's share-group configs too: txbroker has no share groups), a value that is not a
32-bit integer of at least 1, one outside the server's bounds (`group_consumer_min/max_*`, Kafka's
`group.consumer.min/max.*`), and a session timeout not above the heartbeat interval."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.coordinator.audit import Actor, record
from app.errors import BrokerError, ErrorCode
from app.settings import Settings
from app.storage.groups import group_configs as stored
from app.storage.log.topic_configs import INT_MAX, INT_MIN, java_integer

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"


@dataclass(frozen=True, slots=True)
class GroupConfigSpec:
    name: str  # Kafka's
    setting: str  # the server setting that is its default
    minimum_setting: str
    maximum_setting: str
    documentation: str


GROUP_CONFIG_SPECS: dict[str, GroupConfigSpec] = {
    spec.name: spec
    for spec in (
        GroupConfigSpec(
            HEARTBEAT_INTERVAL,
            "group_consumer_heartbeat_interval_ms",
            "group_consumer_min_heartbeat_interval_ms",
            "group_consumer_max_heartbeat_interval_ms",
            "how often the group's consumer-protocol members are told to heartbeat",
        ),
        GroupConfigSpec(
            SESSION_TIMEOUT,
            "group_consumer_session_timeout_ms",
            "group_consumer_min_session_timeout_ms",
            "group_consumer_max_session_timeout_ms",
            "how long a consumer-protocol member of the group may go without a heartbeat before it is removed",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class GroupConfigEntry:
    """One group config as DescribeConfigs describes it: the group's own value (None: it sets none)
    and the server's default."""

    name: str
    own: int | None
    default: int
    setting: str
    documentation: str


def _check_group_id(group_id: str) -> None:
    if not group_id:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST,
            "group resource with an empty name: expected a group id (Kafka has no default group resource)",
        )


async def describe(pool: asyncpg.Pool, settings: Settings, group_id: str) -> list[GroupConfigEntry]:
    """The group's configs, by name: its own value, if any, and the server's default of each."""
    _check_group_id(group_id)
    own = await stored.configs(pool, group_id)
    return [
        GroupConfigEntry(
            name,
            int(own[name]) if name in own else None,
            getattr(settings, spec.setting),
            spec.setting,
            spec.documentation,
        )
        for name, spec in sorted(GROUP_CONFIG_SPECS.items())
    ]


def _parsed(name: str, text: str) -> int:
    """A group config's value as Kafka's INT config reads it (surrounding spaces ignored, Java's
    digits only: no "1_000"), at least 1."""
    value = java_integer(text, INT_MIN, INT_MAX)
    if value is None:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG,
            f"Invalid value {text} for configuration {name}: Not a number of type INT; expected milliseconds "
            f"from 1 to {INT_MAX}",
        )
    if value < 1:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG,
            f"Invalid value {value} for configuration {name}: Value must be at least 1",
        )
    return value


def _check_names(names) -> None:
    for name in sorted(names):
        if name not in GROUP_CONFIG_SPECS:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG,
                f"Unknown group config name: {name}; expected one of {', '.join(sorted(GROUP_CONFIG_SPECS))}",
            )


def _out_of_bounds(name: str, value: int, than: str, setting: str, minimum: int, maximum: int) -> BrokerError:
    """Kafka's message for a group config past the broker's bound (`setting`, under Kafka's name)."""
    bound = minimum if than == "greater" else maximum
    return BrokerError(
        ErrorCode.INVALID_CONFIG,
        f"{name} must be {than} than or equal to {setting.replace('_', '.')} ({bound} on this server, its "
        f"{setting}): received {value}; set a value from {minimum} to {maximum}",
    )


def _validated(settings: Settings, configs: dict[str, str]) -> dict[str, str]:
    """The group's configs as they would be, checked as Kafka's GroupConfig.validate checks them;
    returned with each value written as Kafka writes an INT."""
    _check_names(configs)
    values = {name: _parsed(name, text) for name, text in configs.items()}
    for name, value in values.items():
        spec = GROUP_CONFIG_SPECS[name]
        minimum, maximum = getattr(settings, spec.minimum_setting), getattr(settings, spec.maximum_setting)
        if value < minimum:
            raise _out_of_bounds(name, value, "greater", spec.minimum_setting, minimum, maximum)
        if value > maximum:
            raise _out_of_bounds(name, value, "less", spec.maximum_setting, minimum, maximum)
    session = values.get(SESSION_TIMEOUT, settings.group_consumer_session_timeout_ms)
    interval = values.get(HEARTBEAT_INTERVAL, settings.group_consumer_heartbeat_interval_ms)
    if session <= interval:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG,
            f"{SESSION_TIMEOUT} must be greater than {HEARTBEAT_INTERVAL}: the group's would be {session} and "
            f"{interval} (a value the group does not set is the server's); set a longer session timeout or a "
            f"shorter interval",
        )
    return {name: str(value) for name, value in values.items()}


async def alter(
    pool: asyncpg.Pool,
    settings: Settings,
    actor: Actor,
    group_id: str,
    changes: dict[str, str | None],
    details: str,
    *,
    replace: bool = False,
    validate_only: bool = False,
) -> None:
    """The group's configs changed: each named one set to its value, or back to the server's default
    (None). `replace`: every one not named goes back to its default too (Kafka's AlterConfigs).
    Validated on the group's configs as they would be; `validate_only`: checked, nothing written.
    Two alterations of one group apply one after the other."""
    _check_group_id(group_id)
    async with pool.acquire() as conn, conn.transaction():  # the audit entry is part of the change
        await stored.lock(conn, group_id)
        configs = {} if replace else await stored.configs(conn, group_id)
        for name, value in changes.items():
            if value is None:
                configs.pop(name, None)
            else:
                configs[name] = value
        # A DELETE of a name txbroker does not have is refused too, as Kafka's validation of the
        # whole request refuses it.
        _check_names(changes)
        validated = _validated(settings, configs)
        if validate_only:  # checked in full above: nothing to write
            return
        await stored.replace(conn, group_id, validated)
        await record(conn, actor, "alter group config", group_id, details)


async def consumer_timeouts(
    conn: asyncpg.Connection, group_id: str, session_timeout_ms: int, heartbeat_interval_ms: int
) -> tuple[int, int]:
    """The session timeout and heartbeat interval of the group's consumer-protocol members: the
    group's own, else the server's (given)."""
    own = await stored.configs(conn, group_id)
    return (
        int(own.get(SESSION_TIMEOUT, session_timeout_ms)),
        int(own.get(HEARTBEAT_INTERVAL, heartbeat_interval_ms)),
    )
