"""What every command of `txbroker` shares: its exit codes, the options accepted before and after the
command, and how a command is added and given an Admin client."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from txbroker.connection import DEFAULT_URL
from txbroker.sync import Admin

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Arguments that parse but make no sense together: exit code 2."""


def resource_name(value: str) -> str:
    """An argparse type: a topic, group, transactional id, principal or key id, which is never
    empty (an empty one would name no resource: the server could only answer for its route)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def partition_index(value: str) -> int:
    """An argparse type: a partition, an integer from 0."""
    try:
        partition = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a partition number (0, 1, ...), not {value!r}") from None
    if partition < 0:
        raise argparse.ArgumentTypeError(f"expected a partition number from 0, not {partition}")
    return partition


def admin_command(run: Callable[[argparse.Namespace, Admin], int]) -> Callable[[argparse.Namespace], int]:
    """`run(args, admin)` with an Admin client of the command's --url, --token and --retry-timeout-ms."""

    def command(args: argparse.Namespace) -> int:
        with Admin(args.url, token=args.token, default_api_timeout_ms=args.retry_timeout_ms) as admin:
            return run(args, admin)

    return command


def add_common_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """--url, --token, --json: accepted before and after the command (after wins)."""
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    parser.add_argument(
        "--url",
        default=default(os.environ.get("TXBROKER_URL", DEFAULT_URL)),
        help="server URL (default: $TXBROKER_URL or %s)" % DEFAULT_URL,
    )
    parser.add_argument(
        "--token", default=default(os.environ.get("TXBROKER_TOKEN")), help="bearer token (default: $TXBROKER_TOKEN)"
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="JSON output, for scripts")
    parser.add_argument(
        "--retry-timeout-ms",
        type=int,
        default=default(5_000),
        metavar="MS",
        help="how long to retry when the server is unreachable or busy (default 5000)",
    )


def add_command(subparsers, name: str, help: str, run, **kwargs) -> argparse.ArgumentParser:
    """A command (or an action of a command group) that runs `run(args)`, with the common options."""
    sub = subparsers.add_parser(name, help=help, description=help, **kwargs)
    add_common_options(sub, top=False)
    sub.set_defaults(run=run)
    return sub
