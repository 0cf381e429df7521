"""``execspace image build``: the container backend's image, built by the installed package (docs/backends.md)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..backends.container import DEFAULT_IMAGE, build_image, connect, default_via
from .console import print_json, printable, progress

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "image",
        help="build the container backend's image (Debian with Python, labelled with its languages)",
        description="Images for --backend container. `build` makes a small Debian with python3 (its whole "
        "standard library) and the execspace.languages label, on the daemon at --docker-host (default $DOCKER_HOST "
        "or the default socket).",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="build")
    build = verbs.add_parser(
        "build",
        help="build the image",
        description="--via rootfs (default where mmdebstrap is installed: a Debian host; needs root or subordinate "
        "uids) builds the root from this host's apt sources and imports it, with no registry; --via dockerfile has "
        "the daemon build the packaged Dockerfile (it pulls --base and reaches Debian's archive).",
    )
    build.add_argument("--name", default=DEFAULT_IMAGE, help=f"the image's name (default {DEFAULT_IMAGE})")
    build.add_argument("--via", choices=("rootfs", "dockerfile"), default=None, help="how (default: see above)")
    build.add_argument("--suite", default="", help="rootfs: the Debian suite (default the host's)")
    build.add_argument("--base", default="", help="dockerfile: the base image (default debian:bookworm-slim)")
    build.add_argument("--docker-host", default=None, metavar="URL", help="the daemon (default $DOCKER_HOST)")
    build.add_argument("-q", "--quiet", action="store_true", help="no build output, only the steps")
    p.set_defaults(handler=command)


async def command(args: argparse.Namespace) -> int:
    started = time.monotonic()
    via = args.via or default_via()
    client = connect(args.docker_host)
    try:
        name = await build_image(
            client, args.name, via, _printer(args.quiet, started), suite=args.suite, base=args.base
        )
    finally:
        client.close()
    seconds = round(time.monotonic() - started, 1)
    if args.json:
        print_json({"image": name, "via": via, "seconds": seconds})
    else:
        progress(f"built {name} in {seconds} s; use it: execspace run --image {name} -- python3 -V")
    return 0


def _printer(quiet: bool, started: float) -> Any:
    def show(line: str) -> None:
        if quiet:
            return
        # a build step's carriage returns (dpkg in the chroot writes CRLF, progress redraws its line): what a
        # terminal would leave on screen, the last text after one, rather than an escaped \x0d
        shown = next((part for part in reversed(line.split("\r")) if part), "")
        sys.stderr.write(f"[{time.monotonic() - started:6.1f}s] {printable(shown)}\n")
        sys.stderr.flush()

    return show
