"""Differential test of the command policy against a real bash.

For every generated string the policy accepts, ``bash --noprofile --norc -c <string>`` runs in a directory where
``PATH`` holds only probe programs. A probe records its argv (one file per process, so pipeline members cannot
interleave) and exits 1 when its name starts with ``f``, else 0. The test predicts, from the argv vectors and
operators the parser reported, which simple commands bash must run (``&&``/``||`` short-circuit on those exit
codes) and compares with what the probes recorded, byte for byte. Any extra, missing or different argv — a
substitution the parser missed, a split it got wrong, a glob bash expanded, a tilde it replaced — is a failure.

argv0 values are drawn from a fixed set of names (:data:`BARE_NAMES`, :data:`PATH_NAMES`), rendered with random
quoting, so every probe exists before the run; arguments are free-form and biased toward tricky characters. Half the
commands run under ``LC_ALL=C.UTF-8``, half under ``LC_ALL=C``; ``HOME`` and ``OLDPWD`` hold marker strings so that
a tilde expansion cannot go unnoticed, and the working directory holds files that a glob or brace would match.

The main test checks more than 10,000 distinct accepted commands on bash; a smaller run checks dash (``/bin/sh`` on
Debian), which a runner might use instead.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import random
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from execspace.tools.shellpolicy import CommandPolicy, CommandRejected, ParsedCommand, parse_command

BASH = shutil.which("bash")
DASH = shutil.which("dash")
LOCALES = ("C.UTF-8", "C")
HOME_MARK = "/home-marker"  # a tilde bash expanded shows up as this string in the probe's argv

PROBE = """#!/bin/sh
{ printf 'Z%s\\000' "$0"; for a in "$@"; do printf 'A%s\\000' "$a"; done; printf 'E\\000'; } >>"$PROBE_LOG/$$"
case "${0##*/}" in f*) exit 1 ;; esac
exit 0
"""

BARE_NAMES = (
    "p", "pq", "f", "fq", "p-1", "p.x", "p_2", "=p", "p#", "#p", "p~", "~p", "p^", "p%", "p:q", "p@",
    "p,q", "p+q", "{}", "p{}", "p{q}", "p{a,b}", "é", "fé", "中文", "ƒ", "€", "p q", "p\tq", "p'q", 'p"q', "p\\q",
    "p$q", "p`q", "p*", "p?", "p[1]", "p!", "p|q", "p;q", "p&q", "p(q)", "p<q>", "p~q",
)  # fmt: skip
WORKDIR_PROBES = ("p", "f", "p q", "p'q", "~p", "#p", "é", "sub/p", "sub/f")
PATH_NAMES = (
    "./p", "./f", "sub/p", "sub/f", "./sub/p", "sub//p", "sub/./p", "sub/../p", ".//f", "sub/../f", "./p q", "./p'q",
    "./~p", "./#p", "./é",
)  # fmt: skip
KNOWN_ARGV0 = frozenset(BARE_NAMES) | frozenset(PATH_NAMES)
GLOB_BAIT = ("a", "ab", "x.txt", "[a]", "{a,b}")  # files a wrongly accepted glob or brace would match

# Command words at the edge of the grammar: each must be refused or give a known name (raw {} does).
EDGE_ARGV0 = (
    "{}", "p{}", "p#", "p~", "./~p", "=p", "-p", "p=", "if", "'if'", "\\if", "bash", "sh", "/bin/sh", "BASH", "./sh",
    "env", "xargs", "cd", "export", "eval", "exec", "source", ".", "test", "[", "printf", "time", "command",
    "builtin", "''", "X=1", "a+=b", "'X'=1", "X\\=1", "!", "{", "}", "[[", "function", "do", "coproc", "((1))", "f()",
)  # fmt: skip

SAFE = "apqxyz019-_.,/:@%^+é中€ƒ"
SPECIAL = " \t'\"\\$`|&;<>()*?[]{}!#~="
TEXT_ALPHABET = SAFE * 4 + SPECIAL + "=~#{}"
# Accepted or refused depending on where they land: position rules (word start, after = or :) and escapes.
EDGY = (
    "{}", "#", "#x", "~", "-I~", "\\=~", '""~', "''~", "=\\~", "a\\#",
    "\\{a,b\\}", "\\!", '"a\\.b"', '"\\\\"', '"\\$x"', '"\\`p\\`"', "\\\t", "\\ ", "=", ":", "x~", "\\~",
    "~\\", "'~'", '"~"', "%", "^", ",", "@", "+", "\\#", "a#", "\\$", "\\`", "\\'", '\\"', "\\\\",
)  # fmt: skip
# Refused wherever they land (expansions, redirections, groups, globs, control characters…).
HAZARDS = (
    "{", "}", "{a,b}", "{1..3}", "a{b,c}", "$x", "$", "${x}", "$(p)", "$((1))", "$'a'", '$"a"', "$[1]", "$?", "`p`",
    "*", "?", "[a]", "]", "!", "(", ")", "()", "<", ">", ">>", "2>&1", "&>", "<<<x", "<<x", "<(p)", ">(p)", "&",
    "|&", ";;", ";&", "\n", "\r", "\x1b", "\u200b", "\xa0", "\x7f", "\\", "'", '"', '"$x"', '"`p`"', '"\\"',
    '"\\!"', "{\\}", "\\\n", "=~", ":~", "a=~", "x:~/", "a=b:~", "--x=~",
)  # fmt: skip
ASSIGNMENT_PREFIXES = ("a=", "a+=", "x=y:", "B_1=", "--opt=", "a=b=", "é=")
GOOD_OPERATORS = ("|", "&&", "||", ";")
BAD_OPERATORS = ("&", "|&", ";;", ";&", "|||", "&&&", "> o", "2>&1 |", "\n", "\r\n", " ")
BLANKS = ("", " ", "  ", "\t", " \t ")


def _renderings(ch: str) -> tuple[str, ...]:
    """Ways to write the literal character ``ch`` in the accepted grammar (bare ones weighted up)."""
    ways = [f"\\{ch}"] if ch != "\n" else []
    if ch != "'":
        ways.append(f"'{ch}'")
    if ch != "!":
        ways.append('"' + ("\\" + ch if ch in '$`"\\' else ch) + '"')
    if ch not in SPECIAL:
        ways += [ch] * 3
    elif ch in "#~=":
        ways.append(ch)
    return tuple(ways)


class Grammar:
    """Turns a byte string (drawn by hypothesis, or from a seeded PRNG) into a command string.

    Decoding bytes keeps generation cheap: drawing every choice from hypothesis made 10,000 commands take minutes.
    hypothesis still shrinks a drawn byte string well, because shorter strings and smaller bytes decode to fewer
    segments, words and pieces, and to the first (simplest) entry of every table; past the end every byte reads 0.
    """

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        value = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return value

    def pick(self, options: tuple[str, ...] | str) -> str:
        return options[self.byte() % len(options)]

    def count(self, weights: tuple[int, ...]) -> int:
        return weights[self.byte() % len(weights)]

    def command(self) -> str:
        text = self.pick(BLANKS) + self.segment()
        for _ in range(self.count((0, 0, 1, 1, 1, 2, 2, 3, 4))):
            text += self.operator() + self.segment()
        if self.byte() >= 248:
            text += self.operator()
        return text + self.pick(BLANKS)

    def operator(self) -> str:
        return self.pick(BLANKS) + self.pick(GOOD_OPERATORS * 24 + BAD_OPERATORS) + self.pick(BLANKS)

    def segment(self) -> str:
        words = [self.argv0()] + [self.argument() for _ in range(self.count((0, 1, 1, 2, 2, 3, 4)))]
        return "".join(word + self.pick(BLANKS[1:]) for word in words[:-1]) + words[-1]

    def argv0(self) -> str:
        if self.byte() >= 244:
            return self.pick(EDGE_ARGV0)
        return self.render(self.pick(BARE_NAMES + PATH_NAMES))

    def argument(self) -> str:
        # an assignment-like start (a=, x=y:) is where bash also expands a tilde in an argument
        pieces = [self.pick(ASSIGNMENT_PREFIXES)] if self.byte() >= 224 else []
        for _ in range(self.count((1, 1, 1, 2, 2, 3))):
            kind = self.byte()
            if kind < 140:
                pieces.append(self.render("".join(self.pick(TEXT_ALPHABET) for _ in range(self.byte() % 7))))
            elif kind < 210:
                pieces.append("".join(self.pick(SAFE * 2 + "=~#") for _ in range(1 + self.byte() % 4)))
            elif kind < 250:
                pieces.append(self.pick(EDGY))
            else:
                pieces.append(self.pick(HAZARDS))
        return "".join(pieces)

    def render(self, literal: str) -> str:
        """``literal`` with random quoting: per character, or as one single- or double-quoted run."""
        style = self.byte() % 8
        if style == 1 and "'" not in literal:
            return f"'{literal}'"
        if style == 2 and "!" not in literal:
            return '"' + "".join("\\" + c if c in '$`"\\' else c for c in literal) + '"'
        out = []
        for ch in literal:
            out.append(self.pick(_renderings(ch)))
            if self.byte() >= 232:
                out.append(self.pick(("''", '""')))
        return "".join(out)


def command_batch(seed: int, size: int) -> list[str]:
    rng = random.Random(seed)
    return [Grammar(rng.randbytes(192)).command() for _ in range(size)]


def exit_status(argv0: str) -> int:
    return 1 if posixpath.basename(argv0).startswith("f") else 0


def expected_runs(parsed: ParsedCommand) -> list[tuple[str, ...]]:
    """The argv vectors bash must run, given the probes' exit codes and bash's list semantics."""
    pipelines: list[tuple[str, list[tuple[str, ...]]]] = [(";", [parsed.argvs[0]])]
    for op, argv in zip(parsed.operators, parsed.argvs[1:], strict=True):
        if op == "|":
            pipelines[-1][1].append(argv)
        else:
            pipelines.append((op, [argv]))
    runs: list[tuple[str, ...]] = []
    status = 0
    for op, members in pipelines:
        if op == ";" or (op == "&&") == (status == 0):
            runs += members
            status = exit_status(members[-1][0])
    return runs


def read_log(logdir: Path, bindir: Path) -> list[tuple[bytes, ...]]:
    """The argv vectors the probes recorded; a probe found on PATH sees its full path as $0, so strip bindir."""
    prefix = os.fsencode(bindir) + b"/"
    runs: list[tuple[bytes, ...]] = []
    for path in logdir.iterdir():
        current: list[bytes] = []
        for field in path.read_bytes().split(b"\0")[:-1]:
            if field == b"E":
                runs.append(tuple(current))
                current = []
            elif field.startswith(b"Z"):
                current = [field[1:].removeprefix(prefix) if field.startswith(b"Z" + prefix) else field[1:]]
            else:
                current.append(field[1:])
    return runs


@dataclass(frozen=True)
class Oracle:
    """A prepared directory tree with probes, and a way to run one command string in it."""

    shell: str
    root: Path

    @property
    def bindir(self) -> Path:
        return self.root / "bin"

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    def prepare(self) -> None:
        probe = self.root / "probe"
        probe.write_text(PROBE)
        probe.chmod(0o755)
        (self.workdir / "sub").mkdir(parents=True)
        self.bindir.mkdir()
        (self.root / "logs").mkdir()
        for name in BARE_NAMES:
            (self.bindir / name).symlink_to(probe)
        for name in WORKDIR_PROBES:
            (self.workdir / name).symlink_to(probe)
        for name in GLOB_BAIT:
            (self.workdir / name).write_text("bait")

    def compare(self, command: str, parsed: ParsedCommand) -> str | None:
        """None when the shell ran exactly what ``parsed`` predicts, else a description of the difference."""
        unknown = [argv[0] for argv in parsed.argvs if argv[0] not in KNOWN_ARGV0]
        # an operator inside generated argument text starts a command of a name nobody drew (`a\\|b` runs b): give
        # a bare name its probe too, so that bash must really run it; an unknown path stays a failure
        if any("/" in name or "\0" in name for name in unknown):
            return f"{command!r}: accepted an argv0 outside the generated names: {unknown!r}"
        for name in unknown:
            with contextlib.suppress(FileExistsError):
                (self.bindir / name).symlink_to(self.root / "probe")
        logdir = Path(tempfile.mkdtemp(dir=self.root / "logs"))
        env = {
            "PATH": str(self.bindir),
            "PROBE_LOG": str(logdir),
            "HOME": HOME_MARK,
            "OLDPWD": "/oldpwd-marker",
            "LC_ALL": LOCALES[len(command) % 2],
        }
        proc = subprocess.run(
            [self.shell, "--noprofile", "--norc", "-c", "--", command]
            if self.shell == BASH
            else [self.shell, "-c", "--", command],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        got = sorted(read_log(logdir, self.bindir))
        shutil.rmtree(logdir)
        want = sorted(tuple(arg.encode() for arg in argv) for argv in expected_runs(parsed))
        if got == want:
            return None
        return (
            f"{command!r} (LC_ALL={env['LC_ALL']})\n  policy: {want}\n  shell:  {got}\n  stderr: {proc.stderr[-400:]!r}"
        )


@pytest.fixture
def bash_oracle(tmp_path: Path) -> Oracle:
    if BASH is None:
        pytest.skip("bash is not installed")
    oracle = Oracle(BASH, tmp_path)
    oracle.prepare()
    return oracle


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as executor:
        yield executor


def _accepted(policy: CommandPolicy, text: str) -> ParsedCommand | None:
    try:
        argvs = policy.check(text)
    except CommandRejected:
        return None
    parsed = parse_command(text)
    assert argvs == [list(argv) for argv in parsed.argvs]
    return parsed


def minimize(oracle: Oracle, text: str) -> str:
    """Drop chunks of ``text`` while the result is still accepted and still disagrees with the shell."""

    def fails(candidate: str) -> bool:
        parsed = _accepted(CommandPolicy(), candidate)
        if parsed is None:
            return False
        return oracle.compare(candidate, parsed) is not None

    chunk = max(1, len(text) // 2)
    while True:
        start, shrunk = 0, False
        while start < len(text):
            candidate = text[:start] + text[start + chunk :]
            if candidate.strip() and fails(candidate):
                text, shrunk = candidate, True
            else:
                start += chunk
        if chunk == 1 and not shrunk:
            return text
        chunk = max(1, chunk // 2)


def _differential(oracle: Oracle, pool: ThreadPoolExecutor, batches: int, batch_size: int) -> Counter[str]:
    """Check ``batches`` seeded batches of ``batch_size`` generated commands against ``oracle``; count outcomes.

    Hypothesis draws one seed per batch and a seeded PRNG feeds :class:`Grammar`: drawing the bytes themselves
    repeated most commands across examples (hypothesis mutates earlier examples), and 10,000 distinct ones would
    have taken minutes. A failure is reduced by :func:`minimize` instead of by hypothesis' shrinker.
    """
    policy = CommandPolicy()
    stats: Counter[str] = Counter()
    verdicts: dict[str, str | None] = {}  # hypothesis repeats a failing batch to confirm it: keep its verdicts

    @settings(
        max_examples=batches,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.integers(min_value=0, max_value=2**64 - 1))
    def run_batch(seed: int) -> None:
        batch = command_batch(seed, batch_size)
        accepted = {}
        for text in batch:
            parsed = _accepted(policy, text) if text not in verdicts else None
            if parsed is not None:
                accepted[text] = parsed
            else:
                verdicts.setdefault(text, None)
        verdicts.update(pool.map(lambda item: (item[0], oracle.compare(*item)), accepted.items()))
        stats["run"] += len(accepted)
        stats["segments"] += sum(len(parsed.argvs) for parsed in accepted.values())
        failures = [text for text in dict.fromkeys(batch) if verdicts[text] is not None]
        assert not failures, (
            f"{len(failures)} disagreement(s); the first one minimized: {minimize(oracle, failures[0])!r}\n"
            + "\n".join(str(verdicts[text]) for text in failures[:5])
        )

    run_batch()
    stats["distinct"] = len(verdicts)
    return stats


@pytest.mark.slow
def test_bash_runs_exactly_the_argv_the_policy_reports(bash_oracle: Oracle, pool: ThreadPoolExecutor) -> None:
    stats = _differential(bash_oracle, pool, batches=370, batch_size=50)
    print(f"bash oracle: {stats['run']} accepted commands ({stats['segments']} simple commands) of {stats['distinct']}")
    assert stats["run"] >= 10_000, stats  # the acceptance bar: ≥ 10,000 accepted commands run, zero disagreements
    assert stats["segments"] > stats["run"] * 1.8  # lists and pipelines, not just single commands, were exercised


def test_hypothesis_shrinks_single_commands(bash_oracle: Oracle) -> None:
    """The same property with one hypothesis-drawn byte string per command, so a failure shrinks to a minimal one.

    hypothesis' own bias (runs of zero bytes, repeated and boundary values) also gives shapes a uniform PRNG rarely
    produces: long runs of the simplest choice, the same piece over and over.
    """
    policy = CommandPolicy()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(st.binary(min_size=8, max_size=192))
    def one_command(data: bytes) -> None:
        text = Grammar(data).command()
        parsed = _accepted(policy, text)
        if parsed is not None:
            assert bash_oracle.compare(text, parsed) is None

    one_command()


@pytest.mark.slow
def test_dash_agrees_too(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """A runner may use /bin/sh; on Debian that is dash, which must read accepted strings the same way."""
    if DASH is None:
        pytest.skip("dash is not installed")
    oracle = Oracle(DASH, tmp_path)
    oracle.prepare()
    stats = _differential(oracle, pool, batches=60, batch_size=50)
    assert stats["run"] >= 1_500, stats


@pytest.mark.parametrize(
    ("command", "wrong"),
    [
        ("p a b", ParsedCommand((("p", "a b"),), ())),  # a parser that missed a word split
        ("p ~/x", ParsedCommand((("p", "~/x"),), ())),  # one that missed tilde expansion
        ("p a || p b", ParsedCommand((("p", "a"), ("p", "b")), ("&&",))),  # one that misread the operator
        ("f; p $HOME", ParsedCommand((("f",), ("p", "$HOME")), (";",))),  # one that missed a variable
        ("p * x", ParsedCommand((("p", "*", "x"),), ())),  # one that missed a glob
    ],
)
def test_the_oracle_catches_a_wrong_parse(bash_oracle: Oracle, command: str, wrong: ParsedCommand) -> None:
    difference = bash_oracle.compare(command, wrong)
    assert difference is not None and "policy:" in difference


def test_the_oracle_accepts_a_right_parse(bash_oracle: Oracle) -> None:
    command = "f a || p 'b c' && ./p \"\\$x\" | sub/f {} ; p"
    parsed = parse_command(command)
    assert parsed.argvs == (("f", "a"), ("p", "b c"), ("./p", "$x"), ("sub/f", "{}"), ("p",))
    assert bash_oracle.compare(command, parsed) is None
