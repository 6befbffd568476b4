"""Consumer group membership: the group row (generation, assignment) and its members.

Invariant: every membership change happens with the group's row locked (`lock`), so the generation
and the assignment computed for it always describe the same set of members.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.rows import all_from_rows, from_row

# The key of `consumer_groups.assignment` that holds a Kafka classic-protocol group's state (its
# rebalance state, protocol, leader and each member's protocols and assignment bytes) beside the
# members' topic -> partitions: no member id is empty, and the state then changes under the same
# row lock as the membership it describes (app/coordinator/classic_groups.py), without a migration.
CLASSIC_STATE_KEY = ""

# The key of `consumer_groups.assignment` that holds a KIP-848 consumer group's state (its assignor,
# target assignment and epoch, each member's epoch, assigned partitions and partitions pending
# revocation: app/coordinator/consumer_groups.py) beside the members' topic -> partitions, as
# CLASSIC_STATE_KEY does for the classic protocol, under the same row lock and without a migration.
# Those members choose their own ids (ConsumerGroupHeartbeat v1): one that is any of these keys is
# refused (INVALID_REQUEST).
CONSUMER_STATE_KEY = "consumer group state"

# The key of an HTTP group's `consumer_groups.assignment` that holds the Kafka topic id (KIP-516) of
# each existing subscribed topic the assignment was computed with: a topic deleted and re-created
# under its name is another topic, so the assignment differs (a new generation) even when its
# partitions do not, and members take it up from its committed offsets, not from their positions in
# the deleted one. No member id is this text (the server makes them: "member-" or a client id, then
# a uuid).
TOPIC_IDS_KEY = "topic ids"

# The key of an HTTP group's `consumer_groups.assignment` that holds its revocation barrier's state
# (each member's partitions it may still be processing, its last answer, its revocation deadline:
# app/coordinator/http_revocations.py), beside the members' target assignments, under the same row
# lock and without a migration. No member id is this text (see TOPIC_IDS_KEY).
HTTP_STATE_KEY = "http members"

# A NOTIFY on it, payload the group id, is sent at the commit of a change to a group's membership or
# rebalance state (`announce_change`): the JoinGroups and SyncGroups waiting for that group in every
# server process re-read at once (app/coordinator/classic_groups.py), not at their next poll.
GROUP_CHANGES_CHANNEL = "txbroker_group_changes"


@dataclass(slots=True)
class Group:
    group_id: str
    generation_id: int
    assignment: dict[str, dict[str, list[int]]]  # member id -> topic -> partitions
    last_update_ms: int


@dataclass(frozen=True, slots=True)
class ClassicKind:
    """What a Kafka group's classic state says of the group's kind, all that
    app/coordinator/classic_groups.py `kind_of` reads of it: read from a whole group row
    (`classic_kind`) or by SQL in a listing (`classic_kind_sql`), so that every view of a group
    applies the one rule to the same inputs."""

    protocol_type: str
    state: str
    protocol: str | None
    has_members: bool  # the classic state's members (Kafka's, in the current or last generation)
    # KIP-848's group type: "classic" (JoinGroup's), "consumer" (ConsumerGroupHeartbeat's).
    group_type: str = "classic"


# KIP-848's group types, as ListGroups v5 names them.
CLASSIC_GROUP_TYPE = "classic"
CONSUMER_GROUP_TYPE = "consumer"


def classic_kind(assignment: dict) -> ClassicKind | None:
    """The kind of a group row's assignment; None for a group no Kafka member ever joined."""
    classic = assignment.get(CLASSIC_STATE_KEY)
    if classic is not None:
        return ClassicKind(classic["protocol_type"], classic["state"], classic["protocol"], bool(classic["members"]))
    consumer = assignment.get(CONSUMER_STATE_KEY)
    if consumer is not None:
        return ClassicKind(
            CONSUMER_GROUP_TYPE, consumer["state"], consumer["assignor"], bool(consumer["members"]), CONSUMER_GROUP_TYPE
        )
    return None


def classic_kind_sql(assignment_column: str, key_parameter: str) -> str:
    """`classic_kind` as a jsonb expression of a listing (NULL where it is None), without reading the
    members' protocols and assignment bytes; `key_parameter` names the query's parameter that the
    caller binds to CLASSIC_STATE_KEY. `classic_kind_from_json` makes it a ClassicKind."""
    classic = f"({assignment_column} -> {key_parameter}::text)"
    consumer = f"({assignment_column} -> '{CONSUMER_STATE_KEY}')"
    return (
        f"CASE WHEN {classic} IS NOT NULL THEN jsonb_build_object("
        f"'protocol_type', {classic} -> 'protocol_type', 'state', {classic} -> 'state', "
        f"'protocol', {classic} -> 'protocol', 'has_members', {classic} -> 'members' <> '{{}}'::jsonb) "
        f"WHEN {consumer} IS NOT NULL THEN jsonb_build_object("
        f"'protocol_type', '{CONSUMER_GROUP_TYPE}', 'state', {consumer} -> 'state', "
        f"'protocol', {consumer} -> 'assignor', 'has_members', {consumer} -> 'members' <> '{{}}'::jsonb, "
        f"'group_type', '{CONSUMER_GROUP_TYPE}') END"
    )


def classic_kind_from_json(found: dict | None) -> ClassicKind | None:
    return None if found is None else ClassicKind(**found)


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    topics: list[str]
    session_timeout_ms: int
    joined_ms: int
    last_heartbeat_ms: int


async def hold(conn: asyncpg.Connection, group_id: str, now_ms: int) -> bool:
    """Makes the group exist (generation 0, no members) and holds its row FOR KEY SHARE until the
    caller's transaction ends: a commit calls this before anything else, so it never takes the group
    row after a partition row. The hold lets membership changes through (their FOR UPDATE waits for
    it, as for the commits that check a generation, FOR SHARE) but keeps the row from being deleted:
    a DeleteGroups waits for the commits in flight and then removes what they wrote, and a commit
    that finds its group deleted meanwhile (the row gone once the delete commits) makes it anew, so
    its offsets start a fresh group, never outlive a deleted one. True when this call made the group
    (it did not exist), which the caller's rollback undoes."""
    while True:
        if await conn.fetchval("SELECT 1 FROM consumer_groups WHERE group_id = $1 FOR KEY SHARE", group_id):
            return False
        # Our own new row needs no lock: nobody can delete it before we commit. Losing the race to
        # another creator (nothing returned) means its row is committed now: hold that one.
        created = await conn.fetchval(
            "INSERT INTO consumer_groups (group_id, generation_id, assignment, last_update_ms) "
            "VALUES ($1, 0, '{}', $2) ON CONFLICT (group_id) DO NOTHING RETURNING 1",
            group_id,
            now_ms,
        )
        if created:
            return True


async def lock(conn: asyncpg.Connection, group_id: str, now_ms: int) -> Group:
    """Locks the group's row, creating the group (generation 0, no members) on first use."""
    await conn.execute(
        "INSERT INTO consumer_groups (group_id, generation_id, assignment, last_update_ms) "
        "VALUES ($1, 0, '{}', $2) ON CONFLICT (group_id) DO NOTHING",
        group_id,
        now_ms,
    )
    row = await conn.fetchrow(
        "SELECT group_id, generation_id, assignment, last_update_ms FROM consumer_groups "
        "WHERE group_id = $1 FOR UPDATE",
        group_id,
    )
    return from_row(Group, row)


async def lock_existing(conn: asyncpg.Connection, group_id: str) -> Group | None:
    """The group's row locked FOR UPDATE (waiting for the commits that hold it), or None when no
    group has this id; unlike `lock`, never creates one."""
    row = await conn.fetchrow(
        "SELECT group_id, generation_id, assignment, last_update_ms FROM consumer_groups "
        "WHERE group_id = $1 FOR UPDATE",
        group_id,
    )
    return None if row is None else from_row(Group, row)


async def assigned_topic_ids(conn: asyncpg.Connection, group_id: str) -> dict[str, str]:
    """The topic ids the group's current assignment was computed with (TOPIC_IDS_KEY; none for a
    Kafka group, or a group without a row)."""
    found = await conn.fetchval(
        "SELECT assignment -> $2 FROM consumer_groups WHERE group_id = $1", group_id, TOPIC_IDS_KEY
    )
    return found or {}


async def delete(conn: asyncpg.Connection, group_id: str) -> None:
    """Removes the group's row, which the caller holds (`lock_existing`) and found without members:
    a member joins only under this row's lock, so none can have joined since; or which the caller's
    own transaction made (`hold`), so nobody else has seen it."""
    await conn.execute("DELETE FROM consumer_groups WHERE group_id = $1", group_id)


async def get(conn: asyncpg.Connection, group_id: str) -> Group | None:
    row = await conn.fetchrow(
        "SELECT group_id, generation_id, assignment, last_update_ms FROM consumer_groups WHERE group_id = $1", group_id
    )
    return None if row is None else from_row(Group, row)


async def list_groups(conn: asyncpg.Connection) -> list[tuple[Group, int]]:
    """Every group with its member count."""
    rows = await conn.fetch(
        "SELECT g.group_id, g.generation_id, g.assignment, g.last_update_ms, "
        "(SELECT count(*) FROM group_members m WHERE m.group_id = g.group_id) AS members "
        "FROM consumer_groups g ORDER BY g.group_id"
    )
    return [(from_row(Group, row), row["members"]) for row in rows]


async def members(conn: asyncpg.Connection, group_id: str) -> list[Member]:
    rows = await conn.fetch(
        "SELECT member_id, topics, session_timeout_ms, joined_ms, last_heartbeat_ms "
        "FROM group_members WHERE group_id = $1 ORDER BY member_id",
        group_id,
    )
    return all_from_rows(Member, rows)


async def add_member(conn: asyncpg.Connection, group_id: str, member: Member) -> None:
    await conn.execute(
        "INSERT INTO group_members (group_id, member_id, topics, session_timeout_ms, joined_ms, "
        "last_heartbeat_ms) VALUES ($1, $2, $3, $4, $5, $6)",
        group_id,
        member.member_id,
        member.topics,
        member.session_timeout_ms,
        member.joined_ms,
        member.last_heartbeat_ms,
    )


async def touch_member(
    conn: asyncpg.Connection, group_id: str, member_id: str, topics: list[str], session_timeout_ms: int, now_ms: int
) -> None:
    await conn.execute(
        "UPDATE group_members SET topics = $3, session_timeout_ms = $4, last_heartbeat_ms = $5 "
        "WHERE group_id = $1 AND member_id = $2",
        group_id,
        member_id,
        topics,
        session_timeout_ms,
        now_ms,
    )


async def announce_change(conn: asyncpg.Connection, group_id: str, origin: str) -> None:
    """Notifies GROUP_CHANGES_CHANNEL's listeners of every server when the caller's transaction
    commits (not at all if it rolls back): `group_id` changed, in the process that calls itself
    `origin` (a token without spaces; that process woke its own waiters already)."""
    await conn.execute("SELECT pg_notify($1, $2)", GROUP_CHANGES_CHANNEL, f"{origin} {group_id}")


def announced_change(payload: str) -> tuple[str, str]:
    """(origin, group id) of a GROUP_CHANGES_CHANNEL notification's payload."""
    origin, group_id = payload.split(" ", 1)
    return origin, group_id


async def touch(conn: asyncpg.Connection, group_id: str, member_id: str, now_ms: int) -> bool:
    """A member's heartbeat (its session restarts); False when it is not a member."""
    updated = await conn.execute(
        "UPDATE group_members SET last_heartbeat_ms = $3 WHERE group_id = $1 AND member_id = $2",
        group_id,
        member_id,
        now_ms,
    )
    return updated != "UPDATE 0"


async def credit_sessions(conn: asyncpg.Connection, group_id: str, credit_ms: int, now_ms: int) -> None:
    """Each member's session of the group (whose row the caller holds) is put off by `credit_ms`, as
    if its last heartbeat came that much later, never later than `now_ms`."""
    await conn.execute(
        "UPDATE group_members SET last_heartbeat_ms = least(last_heartbeat_ms + $2, $3) "
        "WHERE group_id = $1 AND last_heartbeat_ms < $3",
        group_id,
        credit_ms,
        now_ms,
    )


async def last_heartbeat_ms(conn: asyncpg.Connection) -> int | None:
    """When the latest heartbeat of any member of any group came; None without members."""
    return await conn.fetchval("SELECT max(last_heartbeat_ms) FROM group_members")


async def groups_with_members(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch("SELECT DISTINCT group_id FROM group_members ORDER BY group_id")
    return [row["group_id"] for row in rows]


async def remove_members(conn: asyncpg.Connection, group_id: str, member_ids: list[str]) -> None:
    await conn.execute(
        "DELETE FROM group_members WHERE group_id = $1 AND member_id = ANY($2::text[])", group_id, member_ids
    )


async def save_generation(conn: asyncpg.Connection, group: Group) -> None:
    await conn.execute(
        "UPDATE consumer_groups SET generation_id = $2, assignment = $3, last_update_ms = $4 WHERE group_id = $1",
        group.group_id,
        group.generation_id,
        group.assignment,
        group.last_update_ms,
    )


async def groups_with_expired_members(conn: asyncpg.Connection, now_ms: int, limit: int = 100) -> list[str]:
    rows = await conn.fetch(
        "SELECT DISTINCT group_id FROM group_members WHERE last_heartbeat_ms + session_timeout_ms < $1 LIMIT $2",
        now_ms,
        limit,
    )
    return [row["group_id"] for row in rows]


async def groups_with_overdue_revocations(conn: asyncpg.Connection, now_ms: int, limit: int = 100) -> list[str]:
    """The consumer groups with a member that has not revoked its partitions within its rebalance
    timeout (`revocation_due_ms`, kept by `set_revocation_deadlines`)."""
    rows = await conn.fetch(
        "SELECT DISTINCT group_id FROM group_members WHERE revocation_due_ms < $1 LIMIT $2", now_ms, limit
    )
    return [row["group_id"] for row in rows]


async def set_revocation_deadlines(conn: asyncpg.Connection, group_id: str, deadlines: dict[str, int | None]) -> None:
    """Each named member's revocation deadline (None: none), in the group whose row the caller holds;
    only the rows whose deadline changes are written."""
    await conn.execute(
        "UPDATE group_members m SET revocation_due_ms = x.due "
        "FROM unnest($2::text[], $3::bigint[]) AS x(member_id, due) "
        "WHERE m.group_id = $1 AND m.member_id = x.member_id AND m.revocation_due_ms IS DISTINCT FROM x.due",
        group_id,
        list(deadlines),
        list(deadlines.values()),
    )


async def set_member_topics(conn: asyncpg.Connection, group_id: str, topics: dict[str, list[str]]) -> None:
    """Each named member's subscribed topics, in the group whose row the caller holds; only the rows
    whose topics change are written."""
    await conn.execute(
        "UPDATE group_members m SET topics = x.topics "
        "FROM jsonb_each($2::jsonb) AS x(member_id, topics) "
        "WHERE m.group_id = $1 AND m.member_id = x.member_id AND m.topics IS DISTINCT FROM x.topics",
        group_id,
        topics,
    )


async def lock_if_free(conn: asyncpg.Connection, group_id: str) -> Group | None:
    """The group's row locked, unless another server is working on it (SKIP LOCKED)."""
    row = await conn.fetchrow(
        "SELECT group_id, generation_id, assignment, last_update_ms FROM consumer_groups "
        "WHERE group_id = $1 FOR UPDATE SKIP LOCKED",
        group_id,
    )
    return None if row is None else from_row(Group, row)
