"""`txbroker principals|acls|audit`: principals, their API keys and SCRAM credentials, ACL rules, the
audit log."""

from __future__ import annotations

import getpass
import sys

from txbroker.cli.command import EXIT_OK, add_command, admin_command, resource_name
from txbroker.cli.output import emit_json, format_time, print_done, print_found
from txbroker.sync import Admin


def principals_create(args, admin: Admin) -> int:
    created = admin.create_principal(args.name, super_user=args.super_user)
    emit_json(created) if args.json else print(
        f"created principal {args.name}{' (super user)' if args.super_user else ''}"
    )
    return EXIT_OK


def principals_list(args, admin: Admin) -> int:
    found = admin.list_principals()
    print_found(
        args.json,
        found,
        lambda p: (p["name"], "yes" if p["super_user"] else "no", format_time(p["created_ms"])),
        ("PRINCIPAL", "SUPER USER", "CREATED"),
        "no principals",
    )
    return EXIT_OK


def principals_delete(args, admin: Admin) -> int:
    admin.delete_principal(args.name)
    print_done(
        args.json, {"deleted": args.name}, f"deleted principal {args.name}, its keys, SCRAM credentials and ACL rules"
    )
    return EXIT_OK


def principals_add_key(args, admin: Admin) -> int:
    key = admin.add_key(args.name)
    if args.json:
        emit_json(key)
    else:
        print(f"key {key['key_id']} for {args.name}; its token (shown this once):\n{key['token']}")
    return EXIT_OK


def principals_keys(args, admin: Admin) -> int:
    found = admin.list_keys(args.name)
    print_found(
        args.json,
        found,
        lambda k: (k["key_id"], format_time(k["created_ms"]), format_time(k["revoked_ms"]) or "-"),
        ("KEY ID", "CREATED", "REVOKED"),
        f"{args.name} has no keys",
    )
    return EXIT_OK


def principals_revoke_key(args, admin: Admin) -> int:
    admin.revoke_key(args.name, args.key_id)
    print_done(
        args.json,
        {"revoked": args.key_id, "principal": args.name},
        f"revoked key {args.key_id} of {args.name}: requests with it are refused from now on",
    )
    return EXIT_OK


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def read_password(prompt: str) -> str:
    """The password from a prompt on a terminal, else the first line of stdin: never an argument,
    which other users' `ps` and the shell's history would show."""
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    return sys.stdin.readline().rstrip("\r\n")


def principals_set_scram(args, admin: Admin) -> int:
    password = read_password(f"{args.mechanism} password for {args.name}: ")
    admin.set_scram_credential(args.name, args.mechanism, password, args.iterations)
    print_done(
        args.json,
        {"principal": args.name, "mechanism": args.mechanism, "iterations": args.iterations},
        f"set the {args.mechanism} credential of {args.name} ({args.iterations} iterations): Kafka connections "
        f"authenticated with the one it replaces are closed",
    )
    return EXIT_OK


def principals_scram(args, admin: Admin) -> int:
    found = admin.list_scram_credentials(args.name)
    print_found(
        args.json,
        found,
        lambda c: (c["mechanism"], c["iterations"], format_time(c["updated_ms"])),
        ("MECHANISM", "ITERATIONS", "UPDATED"),
        f"{args.name} has no SCRAM credentials",
    )
    return EXIT_OK


def principals_delete_scram(args, admin: Admin) -> int:
    admin.delete_scram_credential(args.name, args.mechanism)
    print_done(
        args.json,
        {"deleted": args.mechanism, "principal": args.name},
        f"deleted the {args.mechanism} credential of {args.name}: Kafka connections authenticated with it are closed",
    )
    return EXIT_OK


ACL_HEADERS = ("ID", "PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE TYPE", "PATTERN", "RESOURCE")


def acls_add(args, admin: Admin) -> int:
    acl = admin.add_acl(
        args.principal,
        args.resource_type,
        args.resource_name,
        args.operation,
        pattern_type=args.pattern_type,
        permission=args.permission,
    )
    emit_json(acl) if args.json else print(
        f"added ACL {acl['acl_id']}: {acl['permission']} {acl['operation']} on "
        f"{acl['resource_type']} {acl['resource_name']!r} ({acl['pattern_type']}) "
        f"for {acl['principal']}"
    )
    return EXIT_OK


def acls_list(args, admin: Admin) -> int:
    found = admin.list_acls(args.principal, args.resource_type)
    print_found(
        args.json,
        found,
        lambda a: (
            a["acl_id"],
            a["principal"],
            a["permission"],
            a["operation"],
            a["resource_type"],
            a["pattern_type"],
            a["resource_name"],
        ),
        ACL_HEADERS,
        "no ACL rules",
    )
    return EXIT_OK


def acls_remove(args, admin: Admin) -> int:
    admin.remove_acl(args.acl_id)
    print_done(args.json, {"removed": args.acl_id}, f"removed ACL {args.acl_id}")
    return EXIT_OK


def audit(args, admin: Admin) -> int:
    found = admin.audit_log(args.limit)
    print_found(
        args.json,
        found,
        lambda e: (
            format_time(e["timestamp_ms"]),
            e["principal"],
            e.get("source"),  # the door (http, kafka, console); none from servers before it was recorded
            e.get("client_address"),  # HOST:PORT; none for a server's own entries and from servers before it
            e["action"],
            e["resource"],
            e["details"] or None,
        ),
        ("TIME", "PRINCIPAL", "SOURCE", "CLIENT", "ACTION", "RESOURCE", "DETAILS"),
        "no audit entries",
    )
    return EXIT_OK


def add_commands(commands) -> None:
    """The `principals`, `acls` and `audit` commands."""
    principals = commands.add_parser(
        "principals", help="create, list, delete principals; manage their API keys and SCRAM credentials"
    )
    actions = principals.add_subparsers(dest="principals_command", required=True, metavar="ACTION")
    sub = add_command(actions, "create", "create a principal", admin_command(principals_create))
    sub.add_argument("name", type=resource_name)
    sub.add_argument("--super-user", action="store_true", help="allowed everything")
    add_command(actions, "list", "list principals", admin_command(principals_list))
    add_command(
        actions, "delete", "delete a principal with its keys and ACL rules", admin_command(principals_delete)
    ).add_argument("name", type=resource_name)
    add_command(
        actions, "add-key", "create an API key (prints its token once)", admin_command(principals_add_key)
    ).add_argument("name", type=resource_name)
    add_command(actions, "keys", "list a principal's keys", admin_command(principals_keys)).add_argument(
        "name", type=resource_name
    )
    sub = add_command(actions, "revoke-key", "revoke an API key at once", admin_command(principals_revoke_key))
    sub.add_argument("name", type=resource_name)
    sub.add_argument("key_id", type=resource_name)
    sub = add_command(
        actions,
        "set-scram",
        "set a principal's SASL/SCRAM password for the Kafka listener (read from stdin, or prompted)",
        admin_command(principals_set_scram),
    )
    sub.add_argument("name", type=resource_name)
    sub.add_argument("mechanism", choices=SCRAM_MECHANISMS)
    sub.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations, 4096..16384 (default 4096)")
    add_command(actions, "scram", "list a principal's SCRAM credentials", admin_command(principals_scram)).add_argument(
        "name", type=resource_name
    )
    sub = add_command(
        actions, "delete-scram", "delete a principal's SCRAM credential", admin_command(principals_delete_scram)
    )
    sub.add_argument("name", type=resource_name)
    sub.add_argument("mechanism", choices=SCRAM_MECHANISMS)

    acls = commands.add_parser("acls", help="add, list, remove ACL rules (Kafka's model)")
    actions = acls.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    sub = add_command(actions, "add", "allow (or deny) a principal an operation on resources", admin_command(acls_add))
    sub.add_argument("--principal", required=True, help='a principal name, or "*" for every principal')
    sub.add_argument("--resource-type", required=True, choices=("Topic", "Group", "TransactionalId", "Cluster"))
    sub.add_argument("--resource-name", required=True, help='a name, "*" for all, or a prefix with --prefixed')
    sub.add_argument(
        "--operation", required=True, choices=("Read", "Write", "Create", "Delete", "Describe", "Alter", "All")
    )
    sub.add_argument(
        "--prefixed",
        dest="pattern_type",
        action="store_const",
        const="prefixed",
        default="literal",
        help="the resource name is a prefix",
    )
    sub.add_argument(
        "--deny",
        dest="permission",
        action="store_const",
        const="deny",
        default="allow",
        help="a deny rule (deny wins over allow)",
    )
    sub = add_command(actions, "list", "list ACL rules", admin_command(acls_list))
    sub.add_argument("--principal")
    sub.add_argument("--resource-type", choices=("Topic", "Group", "TransactionalId", "Cluster"))
    add_command(actions, "remove", "remove an ACL rule by id", admin_command(acls_remove)).add_argument(
        "acl_id", type=int
    )

    sub = add_command(commands, "audit", "administrative actions, newest first", admin_command(audit))
    sub.add_argument("--limit", type=int, default=100)
