"""The command policy of ``workspace_exec``: a strict shell parser plus argv0 allow/deny rules.

``CommandPolicy(allow=..., deny=...).check(command)`` returns the argv of every simple command in ``command``
or raises :class:`CommandRejected` (a :class:`~execspace.errors.PolicyViolation`) naming the rule that failed.
The parser is our own and accepts a deliberately tiny subset of the bash language, small enough that every
accepted string means exactly one list of argv vectors; the test suite checks that claim against a real bash.

Accepted grammar
----------------
::

    command   := blank* segment (blank* operator blank* segment)* blank*
    operator  := "|" | "&&" | "||" | ";"
    segment   := word (blank+ word)*                     one simple command; its first word is argv0
    word      := part+                                   the parts are concatenated without separators
    part      := bare | '\\' CHAR | "'" SQCHAR* "'" | '"' (DQCHAR | DQESC)* '"' | "{}"
    blank     := space | tab

- ``bare`` is any printable character except blanks and ``| & ; < > ( ) $ ` \\ ' " * ? [ ] { } !``, with
  two position rules: ``#`` may not start a word (a comment) and ``~`` may not start a word nor follow an
  unquoted ``=`` or ``:`` (tilde expansion, which bash also does in assignment-like arguments such as ``a=~``).
- ``'\\' CHAR`` (unquoted backslash) makes any following character literal, exactly as in bash.
- single quotes hold any characters but ``'``, all literal.
- inside double quotes ``DQCHAR`` is any character but ``" \\ $ ` !``; ``DQESC`` is a backslash: before one of
  ``$ ` " \\`` it yields that character, before anything else both the backslash and the character are kept
  (POSIX rules, so ``"a\\.b"`` is ``a\\.b``). ``!`` is refused even after a backslash (bash keeps the backslash).
- ``{}`` is the only unquoted brace allowed (as ``find -exec`` uses it); it is never a brace expansion.
- "printable" means ``str.isprintable()`` or tab: no control characters (newline, CR, NUL, ESC…), no format,
  separator, surrogate or unassigned code points (zero-width and bidi characters, NBSP).

Everything else is rejected, and the message names the first rule broken: any ``$`` unquoted or in double
quotes (variables, ``${…}``, ``$(…)``, ``$((…))``, ``$[…]``, ``$'…'``, ``$"…"``), backticks, redirections and
here-docs (``< > >> << <<< <> >| &> 2> >&``), process substitution, ``( )`` subshells and function
definitions, ``{ }`` groups and brace expansion, globs ``* ? [ ]``, comments, ``!``, ``&``, ``|&``, ``;;``,
``;&``, empty or trailing operators (``a |``, ``a ;``, ``; a``, ``a && && b``), unterminated quotes, a trailing
backslash, an argv0 that is empty, starts with ``-``, is a shell keyword (``if then else elif fi case esac for
select while until do done in function time coproc { } ! [[ ]]``, quoted or not) or a variable assignment
(``X=1 cmd``), more than ``max_segments`` simple commands and more than ``max_length`` UTF-8 bytes.

argv0 rules, in this order (the first that matches decides)
------------------------------------------------------------
1. **The caller's deny list.** A bare entry (no ``/``) matches any argv0 whose last path component equals it
   case-insensitively (``deny=["curl"]`` stops ``curl``, ``/usr/bin/curl``, ``./CURL``). An entry with a ``/``
   matches argv0 when both are equal after lexical normalisation (``//`` and ``/./`` collapsed),
   case-insensitively; it cannot see other paths to the same file, so prefer bare entries.
2. **The built-in deny list** (:data:`BUILTIN_DENY`), which no allow entry can override. Shells, shell
   builtins that execute their arguments, programs that run another command, privilege changers and the
   dynamic loader are matched by last path component, case-insensitively (``/bin/SH`` is denied). Shell builtins
   that change the shell's state or evaluate code (``cd export set trap hash test printf read`` …) are matched
   only when argv0 is bare, because a path such as ``/usr/bin/printf`` runs the external program, not the
   builtin. Of bash's builtins only :data:`INERT_BUILTINS` pass.
3. **The caller's allow list**, when one is given (``allow=None`` means "no allow list"; ``allow=[]`` allows
   nothing). It is exhaustive: argv0 must match an entry exactly, case-sensitively. A bare entry matches only the
   same bare argv0, found on ``PATH`` (``allow=["ls"]`` does not allow ``/bin/ls`` or ``./ls``); an entry with
   a ``/`` matches only that exact string (``allow=["./build.sh"]`` does not allow ``build.sh`` or ``.//build.sh``).

What this policy cannot stop (the sandbox must)
-----------------------------------------------
Only argv0 is judged. An allowed program that runs other programs is a bypass: ``python3 -c 'import os;
os.system("sh")'``, ``find . -exec sh {} ;``, ``git -c core.pager=sh log``, ``awk 'BEGIN{system("sh")}'``, or a
copy of a shell under another name (``cp /bin/sh mysh`` then ``./mysh``). Use an allow list of programs that do
not execute their arguments, and the ``sandbox`` backend for everything the command may still do.

Many programs that look inert are interpreters in disguise, through their arguments, their environment or a
configuration file they read (from ``HOME``, which the program can write, or from the working directory):

- ``shasum``, ``pod2text``, ``cpan``…: perl scripts, so ``PERL5OPT``/``PERL5DB``/``PERL5LIB`` run code;
  ``python3``, ``perl``, ``ruby``, ``node``, ``lua``, ``php``, ``R``, ``tclsh``: interpreters outright;
- ``less`` (``LESSOPEN``/``LESSCLOSE``, ``!cmd``, ``v`` editor), ``more``, ``man`` (``MANPAGER``, ``PAGER``,
  ``-P``, ``--html=``), ``vim``/``vi``/``ex``/``ed``/``nano`` (``:!``, ``!``, ``-c``, modelines);
- ``git``: ``-c`` and ``GIT_CONFIG_*``, ``GIT_EXTERNAL_DIFF``, ``GIT_SSH_COMMAND``, ``GIT_PAGER``, aliases
  (``!cmd``), ``core.pager``/``core.fsmonitor``/``core.sshCommand``/diff and filter drivers and hooks in any
  config it reads (``~/.gitconfig``, ``.git/config`` of the repository it is run in);
- ``find -exec``/``-execdir``/``-ok``, ``xargs``, ``env``, ``nice``, ``timeout`` (the last four are on the
  built-in deny list; ``find`` is not, since most of its uses are harmless);
- ``awk``/``gawk``/``mawk`` (``system()``, ``|`` pipes), ``sed`` (GNU ``e`` command and ``s///e``),
  ``sort --compress-program``, ``tar`` (``--to-command``, ``--use-compress-program``, ``-I``,
  ``--checkpoint-action=exec``, the same via ``TAR_OPTIONS``), ``zip -TT``, ``rsync -e``, ``ssh -o
  ProxyCommand``, ``make`` (recipes, ``$(shell)``), ``dpkg``, ``pip``, ``npm``/``npx`` (package scripts),
  ``gdb``, ``openssl`` engines, ``busybox``-style multi-call binaries.

In policy mode ``workspace_exec`` closes the environment route (the model's ``env`` passes only through an
allow-list, and the run starts from an empty environment); the arguments route and the configuration-file route
stay open by design: this policy is a guard rail against accidents, and the sandbox (no host secrets, no
network, a private workspace) is the boundary that holds against a program doing any of the above.

What the runner must do
-----------------------
Run the string with ``bash --noprofile --norc -c -- <command>`` (the semantics this parser was proven against)
in a clean environment: no ``BASH_ENV``, ``ENV``, ``BASH_FUNC_*`` functions, ``LD_*``, and a UTF-8 or C locale (a
multibyte locale such as GBK would let a byte of a UTF-8 character swallow the quote that follows it); of the
model's variables only an allow-list of names that make no program run code (``LESSOPEN`` makes ``less`` run a
shell, ``PERL5OPT`` every perl script).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidSpec, PolicyViolation

__all__ = [
    "BUILTIN_DENY",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_MAX_SEGMENTS",
    "INERT_BUILTINS",
    "SHELL_KEYWORDS",
    "CommandPolicy",
    "CommandRejected",
    "ParsedCommand",
    "describe_command_policy",
    "parse_command",
]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


DEFAULT_MAX_LENGTH = 16 * 1024
DEFAULT_MAX_SEGMENTS = 32

#: bash's reserved words; none may be argv0, quoted or not (a quoted one would only name a strange program).
SHELL_KEYWORDS = _names(
    "if then else elif fi case esac for select while until do done in function time coproc { } ! [[ ]]"
)

#: bash builtins that neither execute their arguments nor change state that later commands depend on.
INERT_BUILTINS = frozenset({":", "echo", "true", "false", "pwd", "kill", "exit", "type", "help", "times"})

# Matched by the last path component of argv0, case-insensitively, whatever the directory.
_DENIED_PROGRAMS: dict[str, frozenset[str]] = {
    # busybox/toybox contain an sh applet; the others are shells under their usual names
    "a shell, which runs commands this policy never sees": _names(
        "sh bash rbash zsh dash ksh ksh93 mksh pdksh oksh loksh yash posh ash fish csh tcsh pwsh powershell "
        "elvish nu xonsh busybox toybox"
    ),
    "a builtin that executes its arguments as a command": _names("eval exec source . command builtin"),
    "a program that runs the command given in its arguments": _names(
        "env xargs nohup timeout setsid unshare nsenter chroot chrt nice ionice taskset stdbuf script expect watch "
        "time flock prlimit setpriv capsh systemd-run run-parts parallel strace ltrace valgrind catchsegv unbuffer "
        "fakeroot fakechroot faketime proot bwrap firejail screen tmux dtach"
    ),
    "a privilege changer, which runs a command as another user": _names("sudo su doas pkexec runuser sg newgrp"),
}
# ld-linux-x86-64.so.2 ./anything runs a binary without executing it through the kernel
_DENIED_PREFIXES = {"the dynamic loader, which runs any binary given to it": ("ld-linux", "ld-musl", "ld.so")}

# Matched only for a bare argv0: they mutate the shell (cwd, variables, options, traps, hash table, aliases),
# read into variables, or evaluate array subscripts as code (test -v 'a[$(cmd)]' runs cmd).
# chdir is dash's cd.
_DENIED_BUILTINS = _names(
    "alias bind cd chdir compgen complete compopt declare enable export fc getopts hash history jobs let local "
    "mapfile popd printf pushd read readarray readonly set shopt suspend test [ trap typeset ulimit umask unalias "
    "unset wait break continue return shift caller dirs logout disown fg bg"
)

#: Every name the built-in deny list knows (shell builtins among them only apply to a bare argv0).
BUILTIN_DENY = frozenset().union(*_DENIED_PROGRAMS.values(), _DENIED_BUILTINS)

_BLANKS = " \t"
_ASSIGNMENT = re.compile(r"[^\W\d]\w*\+?=")
_GLOB_CHARS = "*?[]"
_CONTROL_NAMES = {"\n": "newline", "\r": "carriage return", "\0": "NUL", "\x1b": "escape"}


class CommandRejected(PolicyViolation):
    """A command string broke a rule of the command policy.

    ``rule`` is a stable short id (``"command-substitution"``, ``"builtin-deny"`` …), ``offset`` the index in the
    command string where the violation starts (``None`` for rules about the whole string or an argv0).
    """

    def __init__(self, rule: str, message: str, offset: int | None = None) -> None:
        self.rule = rule
        self.offset = offset
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """The simple commands of an accepted string, and the operator between each one and the next."""

    argvs: tuple[tuple[str, ...], ...]
    operators: tuple[str, ...]


@dataclass(slots=True)
class _Word:
    value: str
    offset: int


@dataclass(slots=True)
class _Op:
    text: str
    offset: int


def _reject(rule: str, what: str, offset: int) -> CommandRejected:
    return CommandRejected(rule, f"rejected: {what} at offset {offset}", offset)


def parse_command(
    command: str, *, max_length: int = DEFAULT_MAX_LENGTH, max_segments: int = DEFAULT_MAX_SEGMENTS
) -> ParsedCommand:
    """Parse ``command`` with the grammar of the module docstring; no argv0 policy is applied."""
    _check_text(command, max_length)
    return _assemble(_Lexer(command).run(), max_segments)


def _check_text(command: str, max_length: int) -> None:
    if not isinstance(command, str):
        raise CommandRejected("not-text", f"rejected: the command must be a str, not {type(command).__name__}")
    if len(command) > max_length or len(command.encode("utf-8", "surrogatepass")) > max_length:
        raise CommandRejected("too-long", f"rejected: command longer than {max_length} bytes")
    for offset, ch in enumerate(command):
        if ch != "\t" and not ch.isprintable():
            raise _reject("control-character", _describe_char(ch), offset)
    if not command.strip(_BLANKS):
        raise CommandRejected("empty", "rejected: command is empty")


def _describe_char(ch: str) -> str:
    code = f"U+{ord(ch):04X}"
    if ch in _CONTROL_NAMES:
        return f"control character {code} ({_CONTROL_NAMES[ch]})"
    if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
        return f"control character {code}"
    return f"non-printable character {code}"


class _Lexer:
    """Splits a checked string into words and operators, raising on the first construct outside the grammar."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[_Word | _Op] = []
        self.word: list[str] | None = None  # None between words
        self.word_offset = 0
        self.prev = ""  # the previous character if it was an unquoted literal, else ""

    def run(self) -> list[_Word | _Op]:
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch in _BLANKS:
                self._end_word()
                self.pos += 1
            elif ch in "|&;":
                self._end_word()
                self._operator(ch)
            elif ch == "'":
                self._single_quoted()
            elif ch == '"':
                self._double_quoted()
            elif ch == "\\":
                self._escaped()
            else:
                self._bare(ch)
        self._end_word()
        return self.tokens

    def _peek(self, n: int = 1) -> str:
        return self.text[self.pos + n : self.pos + n + 1]

    def _start_word(self) -> list[str]:
        if self.word is None:
            self.word = []
            self.word_offset = self.pos
        return self.word

    def _end_word(self) -> None:
        if self.word is not None:
            self.tokens.append(_Word("".join(self.word), self.word_offset))
            self.word = None
        self.prev = ""

    def _emit(self, literal: str, advance: int, *, quoted: bool) -> None:
        self._start_word().append(literal)
        self.pos += advance
        self.prev = "" if quoted else literal[-1]

    def _operator(self, ch: str) -> None:
        pair = ch + self._peek()
        if pair in ("&&", "||"):
            self.tokens.append(_Op(pair, self.pos))
            self.pos += 2
            return
        if ch in "|;" and pair not in ("|&", ";;", ";&"):
            self.tokens.append(_Op(ch, self.pos))
            self.pos += 1
            return
        raise _operator_violation(pair, self.pos)

    def _escaped(self) -> None:
        if self.pos + 1 >= len(self.text):
            raise _reject("trailing-backslash", "trailing backslash", self.pos)
        self._emit(self.text[self.pos + 1], 2, quoted=True)

    def _single_quoted(self) -> None:
        end = self.text.find("'", self.pos + 1)
        if end < 0:
            raise _reject("unterminated-quote", "unterminated single quote", self.pos)
        self._emit(self.text[self.pos + 1 : end], end + 1 - self.pos, quoted=True)

    def _double_quoted(self) -> None:
        start, i, parts = self.pos, self.pos + 1, []
        while i < len(self.text) and self.text[i] != '"':
            ch = self.text[i]
            if ch in "$`!":
                raise _double_quote_violation(self.text, i)
            if ch == "\\" and self.text[i + 1 : i + 2] in ("$", "`", '"', "\\"):
                parts.append(self.text[i + 1])
                i += 2
                continue
            parts.append(ch)
            i += 1
        if i >= len(self.text):
            raise _reject("unterminated-quote", "unterminated double quote", start)
        self._emit("".join(parts), i + 1 - start, quoted=True)

    def _bare(self, ch: str) -> None:
        at_word_start = self.word is None
        if ch == "{" and self._peek() == "}":
            self._emit("{}", 2, quoted=False)
            return
        violation = _bare_violation(self.text, self.pos, at_word_start=at_word_start, prev=self.prev)
        if violation is not None:
            raise violation
        self._emit(ch, 1, quoted=False)


def _operator_violation(pair: str, offset: int) -> CommandRejected:
    if pair == "|&":
        return _reject("pipe-stderr", "`|&` (pipe with stderr)", offset)
    if pair in (";;", ";&"):
        return _reject("case-terminator", f"`{pair}` (case terminator)", offset)
    if pair == "&>":
        return _reject("redirection", "redirection `&>`", offset)
    return _reject("background", "background `&`", offset)


def _bare_violation(text: str, pos: int, *, at_word_start: bool, prev: str) -> CommandRejected | None:
    ch = text[pos]
    if ch == "$":
        return _dollar_violation(text, pos)
    if ch == "`":
        return _reject("command-substitution", "command substitution (backtick)", pos)
    if ch in "<>":
        return _redirection_violation(text, pos)
    if ch == "(":
        return _reject("subshell", "subshell or function definition `(`", pos)
    if ch == ")":
        return _reject("subshell", "unexpected `)`", pos)
    if ch in "{}":
        return _reject("brace", f"brace expansion or group `{ch}` (only a literal `{{}}` is allowed)", pos)
    if ch in _GLOB_CHARS:
        return _reject("glob", f"glob character `{ch}` (quote it)", pos)
    if ch == "!":
        return _reject("bang", "`!` (negation or history expansion; quote it)", pos)
    if ch == "#" and at_word_start:
        return _reject("comment", "comment `#`", pos)
    if ch == "~" and (at_word_start or prev in ("=", ":")):
        return _reject("tilde", "tilde expansion `~` (quote it)", pos)
    return None


def _dollar_violation(text: str, pos: int, where: str = "") -> CommandRejected:
    rest = text[pos : pos + 3]
    kinds = {
        "$(": ("command-substitution", "command substitution `$(`"),
        "${": ("parameter-expansion", "parameter expansion `${`"),
        "$[": ("arithmetic", "arithmetic expansion `$[`"),
        "$'": ("ansi-c-quote", "ANSI-C quoting `$'`"),
        '$"': ("locale-quote", 'locale translation `$"`'),
    }
    rule, what = kinds.get(rest[:2], ("variable-expansion", "variable expansion `$`"))
    if rest == "$((":
        rule, what = "arithmetic", "arithmetic expansion `$((`"
    return _reject(rule, what + where, pos)


def _redirection_violation(text: str, pos: int) -> CommandRejected:
    rest = text[pos : pos + 3]
    if rest[:2] in ("<(", ">("):
        return _reject("process-substitution", f"process substitution `{rest[:2]}`", pos)
    if rest == "<<<":
        return _reject("here-doc", "here-string `<<<`", pos)
    if rest[:2] == "<<":
        return _reject("here-doc", "here-document `<<`", pos)
    op = rest[:2] if rest[:2] in (">>", "<>", ">|", ">&", "<&") else rest[0]
    return _reject("redirection", f"redirection `{op}`", pos)


def _double_quote_violation(text: str, pos: int) -> CommandRejected:
    ch = text[pos]
    if ch == "`":
        return _reject("command-substitution", "command substitution (backtick) inside double quotes", pos)
    if ch == "!":
        return _reject("bang", "`!` inside double quotes (history expansion; use single quotes)", pos)
    return _dollar_violation(text, pos, " inside double quotes")


def _assemble(tokens: list[_Word | _Op], max_segments: int) -> ParsedCommand:
    argvs: list[tuple[str, ...]] = []
    operators: list[str] = []
    current: list[_Word] = []
    last_op = _Op("", 0)
    for token in tokens:
        if isinstance(token, _Word):
            current.append(token)
            continue
        if not current:
            raise _reject("empty-segment", f"operator `{token.text}` without a command before it", token.offset)
        argvs.append(_segment(current, len(argvs) + 1, max_segments))
        operators.append(token.text)
        current, last_op = [], token
    if not current:  # never for the first segment: a blank-only string was refused before lexing
        raise _reject("trailing-operator", f"trailing operator `{last_op.text}`", last_op.offset)
    argvs.append(_segment(current, len(argvs) + 1, max_segments))
    return ParsedCommand(tuple(argvs), tuple(operators))


def _segment(words: list[_Word], number: int, max_segments: int) -> tuple[str, ...]:
    first = words[0]
    if number > max_segments:
        raise _reject("too-many-segments", f"more than {max_segments} simple commands", first.offset)
    if not first.value:
        raise _reject("empty-command-name", "empty command name", first.offset)
    if first.value in SHELL_KEYWORDS:
        raise _reject("keyword", f"shell keyword {first.value!r} at command position", first.offset)
    if first.value.startswith("-"):
        # "bash -c '-x …'" would read the whole string as options
        raise _reject("option-name", f"command name {first.value!r} starts with `-`", first.offset)
    if _ASSIGNMENT.match(first.value):
        raise _reject("assignment", f"variable assignment {first.value!r} at command position", first.offset)
    return tuple(word.value for word in words)


def _basename(argv0: str) -> str:
    # posixpath.basename("sh/") is "", but exec("sh/") still names the file sh
    return posixpath.basename(argv0.rstrip("/")) or argv0


def _builtin_denial(argv0: str) -> str | None:
    """Why the built-in deny list refuses ``argv0``, or None."""
    name = _basename(argv0).casefold()
    for reason, names in _DENIED_PROGRAMS.items():
        if name in names:
            return reason
    for reason, prefixes in _DENIED_PREFIXES.items():
        if name.startswith(prefixes):
            return reason
    if "/" not in argv0 and argv0.casefold() in _DENIED_BUILTINS:
        return "a shell builtin that changes the shell's state or evaluates code"
    return None


def _lexical(path: str) -> str:
    return posixpath.normpath(path).casefold()


def _validated_entries(entries: Iterable[str] | None, label: str) -> tuple[str, ...] | None:
    if entries is None:
        return None
    if isinstance(entries, str | bytes):
        raise InvalidSpec(f"{label} must be a list of command names, not a single string: {entries!r}")
    result = tuple(entries)
    for entry in result:
        if not isinstance(entry, str) or not entry or not entry.isprintable():
            raise InvalidSpec(f"{label} entries must be non-empty printable strings, got {entry!r}")
    return result


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """Which shell commands ``workspace_exec`` may run; see the module docstring for the exact rules."""

    allow: Sequence[str] | None = None
    """Exhaustive allow list of argv0 values (None: no allow list; []: nothing is allowed)."""
    deny: Sequence[str] = ()
    """argv0 values to refuse in addition to the built-in deny list."""
    max_length: int = DEFAULT_MAX_LENGTH
    """Longest accepted command, in UTF-8 bytes."""
    max_segments: int = DEFAULT_MAX_SEGMENTS
    """Most simple commands in one string."""
    _deny_bare: frozenset[str] = field(init=False, repr=False, compare=False)
    _deny_paths: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        allow = _validated_entries(self.allow, "allow")
        deny = _validated_entries(self.deny, "deny") or ()
        for name in ("max_length", "max_segments"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "allow", allow)
        object.__setattr__(self, "deny", deny)
        object.__setattr__(self, "_deny_bare", frozenset(e.casefold() for e in deny if "/" not in e))
        object.__setattr__(self, "_deny_paths", frozenset(_lexical(e) for e in deny if "/" in e))

    def check(self, command: str) -> list[list[str]]:
        """Return the argv of each simple command in ``command``, or raise :class:`CommandRejected`."""
        parsed = parse_command(command, max_length=self.max_length, max_segments=self.max_segments)
        for argv in parsed.argvs:
            self._check_argv0(argv[0])
        return [list(argv) for argv in parsed.argvs]

    def _check_argv0(self, argv0: str) -> None:
        if _basename(argv0).casefold() in self._deny_bare or ("/" in argv0 and _lexical(argv0) in self._deny_paths):
            raise CommandRejected("deny", f"denied by deny list: {argv0!r}")
        reason = _builtin_denial(argv0)
        if reason is not None:
            raise CommandRejected("builtin-deny", f"denied by built-in deny list: {argv0!r} ({reason})")
        if self.allow is not None and argv0 not in self.allow:
            raise CommandRejected("not-allowed", f"not in allow list: {argv0!r}")


def describe_command_policy(policy: CommandPolicy | None = None) -> str:
    """The policy's rules as Markdown, for documentation and for the tool description shown to a model."""
    lines = [
        "Commands are simple commands (a program and its arguments) joined by `|`, `&&`, `||` or `;`.",
        "Quote arguments with 'single quotes', \"double quotes\" (no `$`, backtick or `!` inside) or a backslash.",
        "Rejected: `$` in any form, backticks, redirections (`<`, `>`, `2>&1`, here-docs), `(`/`)`, `{`/`}` "
        "(except a literal `{}`), unquoted `* ? [ ]`, `#` at the start of a word, `~` at the start of a word "
        "or after `=`/`:`, `!`, `&`, `|&`, `;;`, shell keywords, `NAME=value` before a command, a program name "
        "that is empty or starts with `-`, empty or trailing operators, control characters and newlines.",
        "Always denied as the program: shells, wrappers that run another command, privilege changers, the "
        "dynamic loader, and (when written without a path) shell builtins that change the shell's state: "
        + ", ".join(f"`{name}`" for name in sorted(BUILTIN_DENY))
        + ".",
    ]
    if policy is not None:
        lines.append(f"Limits: {policy.max_length} bytes, {policy.max_segments} simple commands.")
        if policy.deny:
            lines.append("Also denied: " + ", ".join(f"`{name}`" for name in policy.deny) + ".")
        if policy.allow is not None:
            allowed = ", ".join(f"`{name}`" for name in policy.allow) or "nothing"
            lines.append(f"Only these programs may run (exact match, paths included): {allowed}.")
    lines.append(
        "The policy judges only the program name: an allowed program that runs others (an interpreter, "
        "`find -exec`, `git -c`) is stopped only by the sandbox."
    )
    return "\n".join(f"- {line}" for line in lines)
