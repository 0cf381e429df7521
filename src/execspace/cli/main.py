"""Argument parsing and dispatch for the ``execspace`` command.

Exit status 125 means execspace itself failed (bad arguments, a backend that
cannot start, a policy it cannot enforce), so that it is never confused with
the status of the program that ``execspace run`` passes through.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

from .. import __version__
from ..errors import ExecspaceError
from . import daemon, demo, doctor, env, execcode, image, mcpserve, run, serve, workspaces
from .console import EXIT_EXECSPACE_ERROR, error, error_message, print_json
from .signals import CommandSignals

__all__ = ["build_parser", "main"]

EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_EXECSPACE_ERROR, f"execspace: error: {message}\n")


class _CommandParser(_Parser):
    """A command's parser: an option it does not know is refused by it, with its usage (argparse would hand it up
    to the top-level parser, whose usage says nothing of the command's options)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)} (`{self.prog} --help` lists its options)")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="execspace",
        description="A controlled place to run code: workspaces on backends that say what they enforce.",
    )
    parser.add_argument("--version", action="version", version=f"execspace {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True, parser_class=_CommandParser)
    for module in (run, execcode, doctor, demo, daemon, workspaces, env, image, serve, mcpserve):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; ``parser`` lets the warm daemon reuse one built before it forks."""
    args = (parser or build_parser()).parse_args(argv)
    handler: Callable[[argparse.Namespace], Awaitable[int]] = args.handler
    try:
        return asyncio.run(_call(handler, args))
    except ExecspaceError as exc:
        error(error_message(exc))
        if vars(args).get("json"):  # a caller parsing --json gets the failure as JSON too
            print_json({"error": {"type": type(exc).__name__, "message": error_message(exc)}})
        return EXIT_EXECSPACE_ERROR
    except OSError as exc:  # a host operation of ours failed (a path in the way, a full disk)
        error(f"{exc}; check the path and its permissions, then retry")
        return EXIT_EXECSPACE_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


async def _call(handler: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    """Run the command; SIGTERM cancels it like Ctrl-C does, so that the program (in its own session, out of reach
    of our signals) is killed and the workspace removed, unless the command routes it to a program it runs
    (``args.signals``)."""
    task = asyncio.current_task()
    assert task is not None
    with CommandSignals(task) as signals:
        args.signals = signals
        try:
            return await handler(args)
        except asyncio.CancelledError:
            if signals.terminated:
                return 128 + signal.SIGTERM
            raise
