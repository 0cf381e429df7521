"""``--inject-header HOST:NAME=env:VAR`` and ``--upstream-ca FILE``: credentials the egress proxy adds to requests
to an allowed host, whose values the program never sees (:attr:`~execspace.models.NetworkPolicy.inject`).

A value is only ever read from the caller's environment, never from the command line (argv is visible to every
process of the machine, and lands in shell histories); no message here quotes it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import InvalidSpec, UsageError
from ..models import HeaderInjection, NetworkPolicy, Secret

__all__ = ["add_inject_options", "injection_rules", "with_injections"]

_FORM = "HOST:NAME=env:VAR (the value is read from the environment variable VAR, never from the command line)"


def add_inject_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inject-header",
        action="append",
        default=[],
        type=_rule,
        metavar="HOST:NAME=env:VAR",
        help="the egress proxy adds header NAME, valued from the caller's environment variable VAR, to every "
        "request to HOST (allowed by --allow-domain; *.suffix for subdomains); HTTPS to HOST is ended by the proxy "
        "with a CA the sandbox trusts; the program never sees the value (repeatable)",
    )
    p.add_argument(
        "--upstream-ca",
        type=Path,
        metavar="FILE",
        help="with --inject-header: verify the injected hosts' servers against the CA certificates in FILE (PEM) "
        "instead of this machine's trust store",
    )


def _rule(text: str) -> tuple[str, str, str]:
    left, sep, source = text.partition("=")
    host, colon, name = left.rpartition(":")
    var = source.removeprefix("env:")
    if not sep or not colon or not host or not name or not source.startswith("env:") or not var:
        # the text after "=" is not quoted: it may be a secret typed where env:VAR belongs
        raise argparse.ArgumentTypeError(f"expected {_FORM}, got {left + sep!r}…")
    return host, name, var


def injection_rules(
    rules: Sequence[tuple[str, str, str]], allowed: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[HeaderInjection, ...]:
    """The rules of ``--inject-header``, their values read from ``environ`` (default: this process's); raises
    :class:`UsageError` for an unset variable or a host no ``--allow-domain`` allows."""
    env = os.environ if environ is None else environ
    made = []
    for host, name, var in rules:
        what = f"--inject-header {host}:{name}=env:{var}"
        try:
            rule = HeaderInjection(host, name, Secret.from_env(var, env))
        except InvalidSpec as exc:
            raise UsageError(f"{what}: {exc}") from None
        try:
            NetworkPolicy.allow(allowed, inject=[rule])
        except InvalidSpec:
            raise UsageError(f"{what}: {rule.host} is not allowed: give --allow-domain {rule.host} too") from None
        made.append(rule)
    return tuple(made)


def with_injections(args: argparse.Namespace) -> tuple[tuple[HeaderInjection, ...], Path | None]:
    """The ``inject`` and ``upstream_ca`` of the allow-list the run's flags make (none without --inject-header)."""
    ca: Path | None = args.upstream_ca
    if ca is not None and not args.inject_header:
        raise UsageError("--upstream-ca verifies the hosts of --inject-header: give --inject-header too")
    if not args.inject_header:
        return (), None
    if ca is not None and not ca.is_file():
        raise UsageError(f"--upstream-ca {ca}: no such file (give a PEM file of CA certificates)")
    return injection_rules(args.inject_header, args.allow_domain), None if ca is None else ca.resolve()
