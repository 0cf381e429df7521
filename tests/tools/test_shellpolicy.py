"""The command policy case by case: what the parser accepts (and the argv it reports), what it refuses and under
which rule, the argv0 rules and their precedence, and the bypasses only a sandbox can stop.

The differential proof against a real bash is in test_shellpolicy_oracle.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import execspace.tools
from execspace.errors import ExecspaceError, InvalidSpec, PolicyViolation
from execspace.tools.shellpolicy import (
    BUILTIN_DENY,
    INERT_BUILTINS,
    SHELL_KEYWORDS,
    CommandPolicy,
    CommandRejected,
    describe_command_policy,
    parse_command,
)

BASH = shutil.which("bash")

ACCEPTED: list[tuple[str, list[list[str]]]] = [
    ("ls", [["ls"]]),
    ("ls -la /tmp", [["ls", "-la", "/tmp"]]),
    ("  ls\t-l  ", [["ls", "-l"]]),
    ("a | b", [["a"], ["b"]]),
    ("a && b", [["a"], ["b"]]),
    ("a || b", [["a"], ["b"]]),
    ("a ; b", [["a"], ["b"]]),
    ("a|b&&c||d;e", [["a"], ["b"], ["c"], ["d"], ["e"]]),
    ("echo 'a b'", [["echo", "a b"]]),
    ("echo 'a\"b$c`d\\e!f*g#h~i{j}k(l)m<n>o|p&q;r'", [["echo", 'a"b$c`d\\e!f*g#h~i{j}k(l)m<n>o|p&q;r']]),
    ("echo 'tab\there'", [["echo", "tab\there"]]),
    ('echo "a b"', [["echo", "a b"]]),
    ('echo "a\\"b"', [["echo", 'a"b']]),
    ('echo "a\\\\b"', [["echo", "a\\b"]]),
    ('echo "\\$HOME"', [["echo", "$HOME"]]),
    ('echo "\\`x\\`"', [["echo", "`x`"]]),
    ('grep "a\\.b" f', [["grep", "a\\.b", "f"]]),  # POSIX: other backslashes stay
    ('echo "it\'s"', [["echo", "it's"]]),
    ('echo "#~*?[]{}()<>|&;="', [["echo", "#~*?[]{}()<>|&;="]]),
    ("echo \\$x", [["echo", "$x"]]),
    ("echo a\\ b", [["echo", "a b"]]),
    ("echo \\|\\&\\;\\<\\>\\(\\)", [["echo", "|&;<>()"]]),
    ("echo \\*\\?\\[\\]\\{\\}", [["echo", "*?[]{}"]]),
    ("echo \\!", [["echo", "!"]]),
    ("echo \\#", [["echo", "#"]]),
    ("echo \\~", [["echo", "~"]]),
    ("echo \\a", [["echo", "a"]]),
    ("echo x\\\ty", [["echo", "x\ty"]]),
    ("echo 'line1\\nline2'", [["echo", "line1\\nline2"]]),
    ("find . -name x -exec rm {} \\;", [["find", ".", "-name", "x", "-exec", "rm", "{}", ";"]]),
    ("echo {} a{}b {}{}", [["echo", "{}", "a{}b", "{}{}"]]),
    ("echo a#b", [["echo", "a#b"]]),
    ('echo ""#', [["echo", "#"]]),
    ("git log HEAD~1", [["git", "log", "HEAD~1"]]),
    ("echo x/~ a~b", [["echo", "x/~", "a~b"]]),
    ("echo a\\=~", [["echo", "a=~"]]),  # the = is quoted, so bash does not see an assignment
    ('echo a=""~', [["echo", "a=~"]]),  # the ~ does not follow the = directly
    ("echo '~' \"~\"", [["echo", "~", "~"]]),
    ("echo ''", [["echo", ""]]),
    ('echo "" x', [["echo", "", "x"]]),
    ("echo a''b", [["echo", "ab"]]),
    ("echo 'a'\"b\"c\\d", [["echo", "abcd"]]),
    ("echo é 中文 € ƒ", [["echo", "é", "中文", "€", "ƒ"]]),
    ("echo % ^ + , : @ = . -", [["echo", "%", "^", "+", ",", ":", "@", "=", ".", "-"]]),
    ("echo a=b --x=1 a:b", [["echo", "a=b", "--x=1", "a:b"]]),
    ("./script.sh arg", [["./script.sh", "arg"]]),
    ("/usr/bin/printf x", [["/usr/bin/printf", "x"]]),  # the program, not the builtin
    ("echo if then fi", [["echo", "if", "then", "fi"]]),  # keywords are plain arguments
    ("=x", [["=x"]]),  # not an assignment: no name before =
    ("true && echo ok || pwd", [["true"], ["echo", "ok"], ["pwd"]]),
    ("python3 -c 'print(1)'", [["python3", "-c", "print(1)"]]),
    ("echo '*' \\? '[a]'", [["echo", "*", "?", "[a]"]]),
    ("a ;b", [["a"], ["b"]]),
    (";".join(["a"] * 32), [["a"]] * 32),
]

REJECTED: list[tuple[str, str]] = [
    ("", "empty"),
    ("   ", "empty"),
    ("\t", "empty"),
    ("echo $HOME", "variable-expansion"),
    ("echo $1 $? $$", "variable-expansion"),
    ("echo $", "variable-expansion"),
    ("echo ${HOME}", "parameter-expansion"),
    ("echo $(id)", "command-substitution"),
    ("echo `id`", "command-substitution"),
    ("echo $((1+2))", "arithmetic"),
    ("echo $[1+2]", "arithmetic"),
    ("echo $'a'", "ansi-c-quote"),
    ('echo $"a"', "locale-quote"),
    ('echo "$HOME"', "variable-expansion"),
    ('echo "$(id)"', "command-substitution"),
    ('echo "`id`"', "command-substitution"),
    ('echo "\\\\$x"', "variable-expansion"),  # an escaped backslash, then a live $
    ("echo a > f", "redirection"),
    ("echo a >> f", "redirection"),
    ("cat < f", "redirection"),
    ("a 2>&1", "redirection"),
    ("a 2> f", "redirection"),
    ("a &> f", "redirection"),
    ("a >| f", "redirection"),
    ("a <> f", "redirection"),
    ("a <&3", "redirection"),
    ("cat <<EOF", "here-doc"),
    ("cat <<-EOF", "here-doc"),
    ("cat <<<x", "here-doc"),
    ("diff <(a) <(b)", "process-substitution"),
    ("tee >(a)", "process-substitution"),
    ("(a)", "subshell"),
    ("a; (b)", "subshell"),
    ("f() { a; }", "subshell"),
    ("a )", "subshell"),
    ("{ a; }", "brace"),
    ("echo {a,b}", "brace"),
    ("echo {1..3}", "brace"),
    ("echo a{b,c}", "brace"),
    ("echo }", "brace"),
    ("echo \\{}", "brace"),
    ("echo *", "glob"),
    ("echo a?", "glob"),
    ("echo [ab]", "glob"),
    ("echo ]", "glob"),
    ("[[ -f x ]]", "glob"),
    ("echo a # c", "comment"),
    ("# c", "comment"),
    ("a;#c", "comment"),
    ("! a", "bang"),
    ("echo a!", "bang"),
    ('echo "hi!"', "bang"),
    ('echo "\\!"', "bang"),
    ("a &", "background"),
    ("a & b", "background"),
    ("a &&& b", "background"),
    ("a |& b", "pipe-stderr"),
    ("a ;; b", "case-terminator"),
    ("a ;& b", "case-terminator"),
    ("a |", "trailing-operator"),
    ("a &&", "trailing-operator"),
    ("a ||", "trailing-operator"),
    ("a ;", "trailing-operator"),
    ("| a", "empty-segment"),
    ("; a", "empty-segment"),
    ("a && && b", "empty-segment"),
    ("a || ; b", "empty-segment"),
    ("a ||| b", "empty-segment"),
    ("a\nb", "control-character"),
    ("a\rb", "control-character"),
    ("a\x00b", "control-character"),
    ("a\x1b[2Jb", "control-character"),
    ("a\x7fb", "control-character"),
    ("a\x85b", "control-character"),
    ("echo 'a\nb'", "control-character"),
    ("echo a\\\nb", "control-character"),
    ("echo a\u200bb", "control-character"),  # zero-width space
    ("echo a\u00a0b", "control-character"),  # no-break space looks like a blank
    ("echo \u202eevil", "control-character"),  # bidi override
    ("echo \udc80", "control-character"),  # lone surrogate: not encodable
    ("echo 'abc", "unterminated-quote"),
    ('echo "abc', "unterminated-quote"),
    ('echo "abc\\"', "unterminated-quote"),
    ("echo a\\", "trailing-backslash"),
    ("if true; then a; fi", "keyword"),
    ("while a; do b; done", "keyword"),
    ("for x in a; do b; done", "keyword"),
    ("until a", "keyword"),
    ("time a", "keyword"),
    ("coproc a", "keyword"),
    ("function f", "keyword"),
    ("select x", "keyword"),
    ("a; then", "keyword"),
    ("'if' x", "keyword"),  # quoted: bash would look for a program called if; refused anyway
    ("\\fi", "keyword"),
    ("'{' a", "keyword"),
    ("'!' a", "keyword"),
    ("X=1 a", "assignment"),
    ("a+=1 b", "assignment"),
    ("'X'=1 a", "assignment"),
    ("X\\=1", "assignment"),
    ("PATH=/tmp ls", "assignment"),
    ("~/bin/x", "tilde"),
    ("echo ~", "tilde"),
    ("echo ~root", "tilde"),
    ("echo a=~", "tilde"),
    ("echo a:~", "tilde"),
    ("echo --prefix=~/x", "tilde"),
    ("echo PATH=a:~/b", "tilde"),
    ("-x", "option-name"),
    ("'-c' x", "option-name"),
    ("'' a", "empty-command-name"),
    ('"" a', "empty-command-name"),
]


@pytest.mark.parametrize(("command", "argvs"), ACCEPTED, ids=[repr(c)[:40] for c, _ in ACCEPTED])
def test_accepted(command: str, argvs: list[list[str]]) -> None:
    assert CommandPolicy().check(command) == argvs


@pytest.mark.parametrize(("command", "rule"), REJECTED, ids=[repr(c)[:40] for c, _ in REJECTED])
def test_rejected(command: str, rule: str) -> None:
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check(command)
    assert caught.value.rule == rule, str(caught.value)
    assert str(caught.value).startswith("rejected: ")


def test_the_message_names_the_rule_and_the_offset() -> None:
    cases = {
        "ls -la; echo $(id)": "rejected: command substitution `$(` at offset 13",
        'echo "$HOME"': "rejected: variable expansion `$` inside double quotes at offset 6",
        "echo a >f": "rejected: redirection `>` at offset 7",
        "a\nb": "rejected: control character U+000A (newline) at offset 1",
        "a |": "rejected: trailing operator `|` at offset 2",
        "if x": "rejected: shell keyword 'if' at command position at offset 0",
        "X=1 ls": "rejected: variable assignment 'X=1' at command position at offset 0",
    }
    for command, message in cases.items():
        with pytest.raises(CommandRejected) as caught:
            CommandPolicy().check(command)
        assert str(caught.value) == message
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check("echo $(id)")
    assert caught.value.offset == 5


def test_a_rejection_is_a_policy_violation() -> None:
    with pytest.raises(PolicyViolation):
        CommandPolicy().check("bash")
    assert issubclass(CommandRejected, ExecspaceError)


def test_the_first_violation_is_reported() -> None:
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check("echo * $x")
    assert caught.value.rule == "glob"


def test_length_is_counted_in_utf8_bytes() -> None:
    assert CommandPolicy(max_length=16).check("echo " + "é" * 5) == [["echo", "é" * 5]]  # 15 bytes
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy(max_length=16).check("echo " + "é" * 6)  # 17 bytes, 11 characters
    assert caught.value.rule == "too-long"


def test_the_default_limit_is_16_kib() -> None:
    command = "echo " + "a" * (16 * 1024 - 5)
    assert CommandPolicy().check(command) == [["echo", "a" * (16 * 1024 - 5)]]
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check(command + "a")
    assert caught.value.rule == "too-long"


def test_segment_limit() -> None:
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check(" | ".join(["a"] * 33))
    assert caught.value.rule == "too-many-segments"
    assert CommandPolicy(max_segments=2).check("a && b") == [["a"], ["b"]]
    with pytest.raises(CommandRejected, match="more than 2 simple commands"):
        CommandPolicy(max_segments=2).check("a && b ; c")


def test_a_non_string_is_rejected() -> None:
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy().check(b"ls")  # type: ignore[arg-type]
    assert caught.value.rule == "not-text"


def test_parse_reports_operators() -> None:
    parsed = parse_command("a | b && c || d ; e")
    assert parsed.argvs == (("a",), ("b",), ("c",), ("d",), ("e",))
    assert parsed.operators == ("|", "&&", "||", ";")


# --- argv0 rules -------------------------------------------------------------------------------------------------

BUILTIN_DENIED = [
    "bash -c x", "sh", "/bin/sh -c x", "/usr/bin/env x", "ENV x", "./BASH", "sh/", "/bin//sh", "zsh", "dash", "ksh",
    "mksh", "fish", "csh", "tcsh", "ash", "busybox sh", "toybox sh", "sudo x", "su", "doas x", "xargs x",
    "eval x", "exec x", "source f", ". f", "command ls", "builtin echo", "/usr/bin/time x", "nohup x",
    "timeout 5 x", "setsid x", "unshare x", "nsenter x", "chroot / x", "chrt 1 x", "nice x", "ionice x",
    "taskset 1 x", "stdbuf -o0 x", "script -c x", "expect x", "watch x", "flock f x", "strace x", "runuser x",
    "ld-linux-x86-64.so.2 /bin/ls", "/lib64/ld-linux-x86-64.so.2 x", "ld.so x", "cd /", "export A=1",
    "test -v x", "'[' x ']'", "printf x", "trap x EXIT", "hash -p x ls", "enable -f x y", "ulimit -n 1",
    "read x", "declare x", "alias a=b", "set -e", "shopt -s x", "unset x", "let x", "mapfile x", "wait",
    "jobs -x x", "fc -e x", "compgen -W x", "complete -C x", "umask 0", "chdir /",
]  # fmt: skip


@pytest.mark.parametrize("command", BUILTIN_DENIED)
def test_builtin_deny(command: str) -> None:
    with pytest.raises(CommandRejected, match=r"^denied by built-in deny list: ") as caught:
        CommandPolicy().check(command)
    assert caught.value.rule == "builtin-deny"


def test_the_issue_s_deny_set_is_all_there() -> None:
    required = {
        *("sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh", "tcsh", "ash", "busybox", "toybox"),
        *("eval", "exec", "source", ".", "command", "builtin", "time", "env", "xargs", "sudo", "su", "doas"),
        *("nohup", "timeout", "setsid", "unshare", "nsenter", "chroot", "chrt", "nice", "ionice", "taskset"),
        *("stdbuf", "script", "expect", "watch"),
    }
    assert required <= BUILTIN_DENY


def test_builtins_only_deny_a_bare_name_but_programs_any_path() -> None:
    policy = CommandPolicy()
    assert policy.check("/usr/bin/printf x") == [["/usr/bin/printf", "x"]]
    assert policy.check("./cd") == [["./cd"]]
    with pytest.raises(CommandRejected):
        policy.check("/usr/bin/env")


def test_inert_builtins_pass() -> None:
    assert CommandPolicy().check("echo hi && true && pwd") == [["echo", "hi"], ["true"], ["pwd"]]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_every_bash_builtin_and_keyword_is_classified() -> None:
    """A bash with a new builtin fails here until someone decides whether it is inert or denied."""
    assert BASH is not None

    def words(flag: str) -> set[str]:
        out = subprocess.run([BASH, "--noprofile", "--norc", "-c", f"compgen {flag}"], capture_output=True, text=True)
        return set(out.stdout.split())

    builtins = words("-b")
    assert "cd" in builtins and "eval" in builtins
    assert builtins - BUILTIN_DENY - INERT_BUILTINS == set()
    assert not INERT_BUILTINS & BUILTIN_DENY
    assert words("-k") == SHELL_KEYWORDS


def test_caller_deny_matches_by_basename_case_insensitively() -> None:
    policy = CommandPolicy(deny=["curl"])
    for command in ("curl x", "/usr/bin/curl x", "./CURL", "sub/Curl"):
        with pytest.raises(CommandRejected, match=r"^denied by deny list: ") as caught:
            policy.check(command)
        assert caught.value.rule == "deny"
    assert policy.check("curlx") == [["curlx"]]


def test_caller_deny_path_entry_matches_that_path_lexically() -> None:
    policy = CommandPolicy(deny=["/opt/tool"])
    for command in ("/opt/tool", "/opt//tool", "/opt/./tool", "/OPT/TOOL"):
        with pytest.raises(CommandRejected):
            policy.check(command)
    assert policy.check("tool") == [["tool"]]
    assert policy.check("/other/tool") == [["/other/tool"]]


def test_deny_beats_builtin_deny_beats_allow() -> None:
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy(deny=["bash"]).check("bash")
    assert caught.value.rule == "deny"
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy(allow=["bash", "/bin/bash"]).check("/bin/bash")
    assert caught.value.rule == "builtin-deny"
    with pytest.raises(CommandRejected) as caught:
        CommandPolicy(allow=["curl"], deny=["curl"]).check("curl")
    assert caught.value.rule == "deny"


def test_allow_list_is_exhaustive_and_exact() -> None:
    policy = CommandPolicy(allow=["ls", "./build.sh"])
    assert policy.check("ls -l | ./build.sh x") == [["ls", "-l"], ["./build.sh", "x"]]
    for command, name in [
        ("cat f", "cat"),
        ("/bin/ls", "/bin/ls"),
        ("./ls", "./ls"),
        ("LS", "LS"),
        ("build.sh", "build.sh"),
        (".//build.sh", ".//build.sh"),
        ("ls | cat", "cat"),
        ("echo hi", "echo"),
    ]:
        with pytest.raises(CommandRejected) as caught:
            policy.check(command)
        assert caught.value.rule == "not-allowed"
        assert str(caught.value) == f"not in allow list: {name!r}"


def test_an_empty_allow_list_allows_nothing() -> None:
    with pytest.raises(CommandRejected, match="not in allow list"):
        CommandPolicy(allow=[]).check("ls")
    assert CommandPolicy(allow=None).check("ls") == [["ls"]]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allow": "ls"},
        {"deny": "rm"},
        {"deny": [""]},
        {"allow": ["a\nb"]},
        {"allow": [3]},
        {"max_length": 0},
        {"max_segments": -1},
        {"max_segments": True},
        {"max_length": "16"},
    ],
)
def test_invalid_configuration(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        CommandPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_lists_are_frozen_copies() -> None:
    allow = ["ls"]
    policy = CommandPolicy(allow=allow)
    allow.append("rm")
    with pytest.raises(CommandRejected):
        policy.check("rm x")
    assert policy == CommandPolicy(allow=("ls",))


def test_describe_names_the_rules_and_the_lists() -> None:
    text = describe_command_policy(CommandPolicy(allow=["ls", "./build.sh"], deny=["curl"], max_segments=4))
    for fragment in ("`|`, `&&`, `||` or `;`", "`bash`", "`eval`", "`curl`", "`./build.sh`", "4 simple commands",
                     "sandbox"):  # fmt: skip
        assert fragment in text
    assert "Only these programs" not in describe_command_policy(CommandPolicy())
    assert "nothing" in describe_command_policy(CommandPolicy(allow=[]))


def test_exported_from_execspace_tools() -> None:
    assert execspace.tools.CommandPolicy is CommandPolicy
    assert execspace.tools.CommandRejected is CommandRejected
    assert execspace.tools.describe_command_policy is describe_command_policy


# --- properties --------------------------------------------------------------------------------------------------

_PRINTABLE = st.text(
    st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"), include_characters=" \t"),
    max_size=8,
)


def _plain_argv0(word: str) -> bool:
    return bool(word) and word not in SHELL_KEYWORDS and not word.startswith("-") and "=" not in word


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(st.lists(st.lists(_PRINTABLE, min_size=1, max_size=4).filter(lambda a: _plain_argv0(a[0])), min_size=1,
                max_size=4))  # fmt: skip
def test_shlex_quoting_round_trips(argvs: list[list[str]]) -> None:
    """Whatever shlex.join produces (the standard way to quote an argv) parses back to the same argv."""
    command = " ; ".join(shlex.join(argv) for argv in argvs)
    assert parse_command(command).argvs == tuple(tuple(argv) for argv in argvs)


@settings(max_examples=1000, deadline=None, database=None, derandomize=True)
@given(st.text(max_size=60) | st.text("ab $`'\"\\|&;<>(){}[]*?!#~= \t\n", max_size=30))
def test_any_text_is_parsed_or_rejected_cleanly(text: str) -> None:
    try:
        CommandPolicy().check(text)
    except CommandRejected as exc:
        assert exc.rule and str(exc)


# --- what the policy cannot stop ---------------------------------------------------------------------------------


def _run_in_bash(command: str, cwd: Path) -> str:
    assert BASH is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        [BASH, "--noprofile", "--norc", "-c", "--", command], cwd=cwd, env=env, capture_output=True, text=True
    )
    return done.stdout + done.stderr


BYPASSES = [
    ("python3 -c 'import os; os.system(\"echo PWNED\")'", "python3"),
    ("find . -maxdepth 0 -exec sh -c 'echo PWNED' \\;", "find"),
    ("git -c alias.x='!echo PWNED' x", "git"),
    ("awk 'BEGIN { system(\"echo PWNED\") }'", "awk"),
    ("./mysh -c 'echo PWNED'", "./mysh"),
]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize(("command", "argv0"), BYPASSES, ids=[argv0 for _, argv0 in BYPASSES])
def test_bypasses_the_policy_cannot_stop(tmp_path: Path, command: str, argv0: str) -> None:
    """Accepted on argv0 alone, and a real bash then runs a shell: only an allow list or the sandbox helps.

    The module docstring says so; this test pins it, so nobody mistakes the policy for a sandbox.
    """
    program = argv0.removeprefix("./")
    if argv0.startswith("./"):
        shutil.copy("/bin/sh", tmp_path / program)  # a shell under another name
    elif shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    assert CommandPolicy().check(command)[0][0] == argv0
    assert "PWNED" in _run_in_bash(command, tmp_path)
    with pytest.raises(CommandRejected, match="not in allow list"):
        CommandPolicy(allow=["ls"]).check(command)
    with pytest.raises(CommandRejected, match="denied by deny list"):
        CommandPolicy(deny=[program]).check(command)


def test_a_deny_entry_does_not_cover_other_names_for_the_same_program() -> None:
    policy = CommandPolicy(deny=["python3"])
    with pytest.raises(CommandRejected):
        policy.check("/usr/bin/python3 -c x")
    assert policy.check("python3.11 -c x") == [["python3.11", "-c", "x"]]
    assert policy.check("./py -c x") == [["./py", "-c", "x"]]


def test_the_shell_itself_is_denied_under_any_path() -> None:
    for command in ("sh -c 'echo PWNED'", "/bin/sh -c x", "/usr/bin/../bin/sh", "SH"):
        with pytest.raises(CommandRejected, match="built-in deny list"):
            CommandPolicy(allow=["sh", "/bin/sh"]).check(command)
