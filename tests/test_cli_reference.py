"""docs/cli.md documents the real parser: every command, every option and every choice, each in its command's
section, and no option the command does not have (so the page cannot rot when a flag is added or removed)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from execspace.cli.main import build_parser

CLI_MD = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
_HEADING = re.compile(r"^(#+) (.*)$", re.M)


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("execspace",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _own_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions if not isinstance(a, argparse._HelpAction) for o in a.option_strings}


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    return {
        str(c)
        for a in parser._actions
        if a.choices is not None and not isinstance(a, argparse._SubParsersAction)
        for c in a.choices
    }


def section(text: str, command: str) -> str:
    """The text under the heading that is exactly `command` in backticks, up to the next heading of its level or
    above (so a command's section holds its subcommands' sections)."""
    headings = list(_HEADING.finditer(text))
    for i, h in enumerate(headings):
        if h.group(2).strip() == f"`{command}`":
            level = len(h.group(1))
            end = next((n.start() for n in headings[i + 1 :] if len(n.group(1)) <= level), len(text))
            return text[h.end() : end]
    raise AssertionError(f"docs/cli.md has no heading `{command}`")


def _code_words(text: str) -> set[str]:
    """The words written as code (in backticks or fenced blocks): where option names and values belong."""
    spans = re.findall(r"```.*?```|`[^`\n]+`", text, re.S)
    return set(re.findall(r"[\w.-]+", " ".join(spans)))


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p in COMMANDS])
def test_every_option_and_choice_is_in_its_section(path: tuple[str, ...]) -> None:
    parser = COMMANDS[path]
    words = _code_words(section(CLI_MD.read_text(), " ".join(path)))
    missing = sorted((_own_options(parser) | _choices(parser)) - words)
    assert not missing, f"docs/cli.md, section `{' '.join(path)}`, does not name {missing}"


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p in COMMANDS])
def test_a_section_names_no_option_its_command_lacks(path: tuple[str, ...]) -> None:
    """Long options its command, the commands above it or those below it (in its subsections) really take (short
    ones are left out: an example's `python3 -c` is not ours)."""
    related = [p for p in COMMANDS if p[: len(path)] == path or path[: len(p)] == p]
    known = {"-h", "--help"}.union(*(_own_options(COMMANDS[p]) for p in related))
    written = {w for w in _code_words(section(CLI_MD.read_text(), " ".join(path))) if re.fullmatch(r"--[a-z][\w-]*", w)}
    unknown = sorted(written - known)
    assert not unknown, f"docs/cli.md, section `{' '.join(path)}`, names {unknown}, which it does not take"


def test_the_reference_covers_each_command_and_the_parser_has_them() -> None:
    # the parametrised tests above pass vacuously if the walk finds nothing
    assert {"run", "exec-code", "doctor", "demo", "daemon", "ws", "serve"} <= {p[1] for p in COMMANDS if len(p) == 2}
    assert {("execspace", "ws", verb) for verb in ("list", "rm", "gc")} <= set(COMMANDS)
    assert "--older-than" in _own_options(COMMANDS[("execspace", "ws", "gc")])
