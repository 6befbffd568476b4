"""The `txbroker` command's client commands (the server's `serve` and `db` live in app/cli.py, which
hands every other command to `main` here; they plug in through the `txbroker.commands` entry points).
The client commands speak HTTP only, through the SDK.

    txbroker topics create|list|describe|delete
    txbroker produce TOPIC              lines from stdin; --key-separator; --transactional-id
    txbroker consume TOPIC              --group, --from-beginning, --max-records, --timeout-ms, --json
    txbroker transactions list|describe|abort|find-hanging
    txbroker producers TOPIC PARTITION
    txbroker markers TOPIC PARTITION
    txbroker groups list|describe|delete
    txbroker principals create|list|delete|add-key|keys|revoke-key|set-scram|scram|delete-scram
    txbroker acls add|list|remove
    txbroker audit

One module per command group (topics, produce, consume, transactions, groups, security), each adding
its commands to the parser built here; command.py holds what they share, output.py how they print.

Human-readable tables by default, `--json` for scripts. Exit codes: 0 ok; 1 an error (the server's
code and message, or why it could not be reached, on stderr); 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import entry_points

from txbroker.errors import InvalidResponseError, TxbrokerConnectionError, TxbrokerError

# The client commands' modules (and with them the SDK's clients and httpx) are imported by
# build_parser and main, not here: `txbroker serve` needs none of them, and a node loaded them at
# every start.


def build_parser() -> argparse.ArgumentParser:
    from txbroker.cli import consume, groups, produce, security, topics, transactions
    from txbroker.cli.command import add_common_options

    parser = argparse.ArgumentParser(
        prog="txbroker",
        description="Kafka's transactional messaging over HTTP",
        epilog="server commands, when txbroker-server is installed: txbroker serve, txbroker db upgrade "
        "(see txbroker serve --help)",
    )
    add_common_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for group in (topics, produce, consume, transactions, groups, security):
        group.add_commands(commands)
    _add_installed_commands(commands)
    return parser


COMMANDS_GROUP = "txbroker.commands"


def _add_installed_commands(commands) -> None:
    """Commands other distributions register in the entry-point group `txbroker.commands` (the
    server's `serve` and `db`): each entry point is a function that adds its subparser, with a `run`
    default, to `commands`. Found by name only, so the SDK never imports the server."""
    for entry_point in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            add_command = entry_point.load()
        except Exception as error:  # a broken server install must not take the client commands down
            print(
                f"warning: txbroker command {entry_point.name!r} ({entry_point.value}) could not be loaded: "
                f"{type(error).__name__}: {error}; reinstall the distribution that provides it "
                f"(scripts/setup in a checkout)",
                file=sys.stderr,
            )
            continue
        add_command(commands)


def _installed_command_parser(name: str) -> argparse.ArgumentParser | None:
    """A parser of the one installed command called `name` (the server's `serve` or `db`), without
    the client commands; None if no distribution installs a command of that name, or if it cannot be
    loaded (build_parser then says why)."""
    for entry_point in entry_points(group=COMMANDS_GROUP, name=name):
        try:
            add_command = entry_point.load()
        except Exception:
            return None
        parser = argparse.ArgumentParser(prog="txbroker")
        add_command(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
        return parser
    return None


def _unreachable(error: BaseException) -> str | None:
    """Why the server could not be reached, when that is what `error` (or what it gave up on) is;
    None for an answer that came but is not the contract's (its own message says what came)."""
    while error is not None and not isinstance(error, TxbrokerConnectionError):
        error = error.__cause__
    if error is None or isinstance(error, InvalidResponseError):
        return None
    cause = error.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else error.message


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    installed = _installed_command_parser(argv[0]) if argv else None
    if installed is not None:
        args = installed.parse_args(argv)
        try:
            return args.run(args)
        except KeyboardInterrupt:
            return 130
    from txbroker.cli.command import EXIT_ERROR, EXIT_OK, EXIT_USAGE, UsageError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        parser.error(str(error))  # exits with 2
    except ValueError as error:
        # What the SDK's clients refuse to be made with (a URL that is none, a token that cannot
        # travel in a header): the arguments' fault, said without a traceback.
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except TxbrokerError as error:
        unreachable = _unreachable(error)
        if unreachable is not None:
            print(
                f"error: cannot reach txbroker at {args.url}: {unreachable} (is the server running? "
                f"--url or TXBROKER_URL name another)",
                file=sys.stderr,
            )
        else:
            print(f"error: {error.code}: {error.message}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    return EXIT_ERROR
