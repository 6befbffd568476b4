"""`txbroker groups list|describe|delete`: consumer groups, their members, committed offsets and lag."""

from __future__ import annotations

from txbroker.cli.command import EXIT_OK, add_command, admin_command, resource_name
from txbroker.cli.output import emit_json, print_done, print_found, print_table
from txbroker.sync import Admin


def groups_list(args, admin: Admin) -> int:
    found = admin.list_groups()
    print_found(
        args.json,
        found,
        lambda g: (g["group_id"], g["state"], g["generation_id"], g["members"]),
        ("GROUP", "STATE", "GENERATION", "MEMBERS"),
        "no groups",
    )
    return EXIT_OK


def groups_describe(args, admin: Admin) -> int:
    group = admin.describe_group(args.group)
    if args.json:
        emit_json(group)
        return EXIT_OK
    print(
        f"group {group['group_id']}: {group['state']}, generation {group['generation_id']}, "
        f"{len(group['members'])} member(s)"
    )
    if group["members"]:
        print()
        print_table(
            [
                (
                    m["member_id"],
                    ",".join(m["topics"]),
                    " ".join(f"{a['topic']}:{','.join(map(str, a['partitions']))}" for a in m["assignment"]) or None,
                )
                for m in group["members"]
            ],
            ("MEMBER", "TOPICS", "ASSIGNMENT"),
            "",
        )
    print()
    print_table(
        [
            (
                o["topic"],
                o["partition"],
                o["offset"],
                o["high_watermark"],
                _lag(o),
                "yes" if o.get("pending_transactional_offset") else "no",
            )
            for o in group["offsets"]
        ],
        ("TOPIC", "PARTITION", "COMMITTED", "HIGH WATERMARK", "LAG", "PENDING TXN"),
        "no committed offsets",
    )
    return EXIT_OK


def _lag(offset: dict) -> str | int | None:
    """The lag as the console shows it: "≤ N" when the server counted it up to a bound (more
    transaction markers ahead than it counts: docs/api.md), none for a committed offset that is no
    position (negative, a Kafka admin tool's -1)."""
    lag = offset["lag"]
    return f"≤ {lag}" if lag is not None and offset.get("lag_exact") is False else lag


def groups_delete(args, admin: Admin) -> int:
    admin.delete_group(args.group)
    print_done(args.json, {"deleted": args.group}, f"deleted group {args.group}")
    return EXIT_OK


def add_commands(commands) -> None:
    """The `groups` command group."""
    groups = commands.add_parser("groups", help="list, describe and delete consumer groups")
    group_commands = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    add_command(group_commands, "list", "list groups", admin_command(groups_list))
    add_command(
        group_commands, "describe", "members, assignment, committed offsets and lag", admin_command(groups_describe)
    ).add_argument("group", type=resource_name)
    add_command(
        group_commands, "delete", "delete a group without members, with its offsets", admin_command(groups_delete)
    ).add_argument("group", type=resource_name)
