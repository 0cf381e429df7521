"""The macOS Seatbelt profile generator, tested on any OS (sandbox-exec itself exists only on macOS).

Three kinds of checks: golden files (the exact profile for several policies: any change is
reviewed), structure (the profile parses, starts deny-by-default, escapes what it names), and
meaning: a small evaluator of the SBPL subset we emit decides reads, writes and renames for many
paths, under both plausible rule orders (last match wins / deny wins), and must agree with
``SandboxPolicy.decide`` - the rules Linux enforces with mounts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from wcmatch import glob as wglob

from execspace import PolicyViolation
from execspace.backends.sandbox import Profile, SandboxPolicy
from execspace.backends.sandbox.seatbelt import build_profile, glob_deny_regex, glob_to_regex

GOLDEN = Path(__file__).parent / "golden"
WS = "/Users/alice/ws"
HOME = "/Users/alice"

POLICIES = {
    "default": (SandboxPolicy(), {}),
    "read_only": (SandboxPolicy(profile=Profile.READ_ONLY), {"tmpdir": "/private/var/folders/xy/T/execspace-sb-1"}),
    "network_on": (SandboxPolicy().with_network(True), {}),
    "root_write": (SandboxPolicy(protected=(".git", "work/repo/.git")).with_write_paths("."), {}),
    "rules": (
        SandboxPolicy()
        .with_no_access("work/secret", "/opt/data/private")
        .with_read_paths("work/secret/pub", "/opt/data", HOME)
        .with_write_paths("/Users/alice/scratch")
        .with_no_access_globs("**/*.pem", "work/keys/**", "out/[!a-c]?.key"),
        {},
    ),
}


def profile_of(name: str) -> str:
    policy, kw = POLICIES[name]
    return build_profile(policy, WS, home=HOME, **kw)


# -- golden files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_golden_profiles(name: str) -> None:
    path = GOLDEN / f"{name}.sb"
    text = profile_of(name)
    if os.environ.get("EXECSPACE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"profile changed; review it and rerun with EXECSPACE_UPDATE_GOLDEN=1 ({path})"


def test_output_is_deterministic() -> None:
    assert profile_of("rules") == profile_of("rules")
    a = SandboxPolicy(home=HOME).with_read_paths("/b", "/a").with_no_access("work/y", "work/x")
    b = SandboxPolicy(home=HOME).with_read_paths("/a", "/b").with_no_access("work/x", "work/y")

    def body(p: SandboxPolicy) -> str:
        return build_profile(p, WS).split("\n", 1)[1]  # the first line echoes the input order

    assert body(a) == body(b)


# -- a parser and evaluator for the SBPL we emit --------------------------------------------------------

Sexp = str | list["Sexp"]
_TOKEN = re.compile(r'\s+|;[^\n]*|"(?:\\.|[^"\\])*"|[()]|[^\s()";]+')


def parse(text: str) -> list[Sexp]:
    """Top-level forms; raises on unbalanced parentheses or stray text."""
    stack: list[list[Sexp]] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None, f"cannot tokenise at {text[pos : pos + 20]!r}"
        tok = m.group(0)
        pos = m.end()
        if tok.isspace() or tok.startswith(";"):
            continue
        if tok == "(":
            stack.append([])
        elif tok == ")":
            assert len(stack) > 1, "unbalanced ')'"
            done = stack.pop()
            stack[-1].append(done)
        elif tok.startswith('"'):
            stack[-1].append("S:" + re.sub(r"\\(.)", r"\1", tok[1:-1]))
        else:
            stack[-1].append(tok)
    assert len(stack) == 1, "unbalanced '('"
    return stack[0]


def _matches(flt: Sexp, path: str) -> bool:
    assert isinstance(flt, list) and isinstance(flt[0], str)
    kind, args = flt[0], flt[1:]
    if kind == "require-all":
        return all(_matches(a, path) for a in args)
    if kind == "require-not":
        return not _matches(args[0], path)
    value = str(args[0])[2:]
    if kind == "subpath":
        return path == value or path.startswith(value.rstrip("/") + "/")
    if kind == "literal":
        return path == value
    if kind == "regex":
        return re.search(value, path) is not None
    return False  # filters on other kinds of objects (sysctl, mach names…) never match a file path


def _covers(ops: list[str], op: str) -> bool:
    return any(o == op or (o.endswith("*") and op.startswith(o[:-1])) for o in ops)


@dataclass
class Profile_:
    rules: list[tuple[str, list[str], list[Sexp]]]

    @classmethod
    def of(cls, text: str) -> Profile_:
        rules = []
        for form in parse(text):
            assert isinstance(form, list) and form[0] in ("version", "allow", "deny"), form
            if form[0] == "version":
                continue
            ops = [x for x in form[1:] if isinstance(x, str)]
            filters: list[Sexp] = [x for x in form[1:] if isinstance(x, list)]
            rules.append((str(form[0]), ops, filters))
        return cls(rules)

    def allowed(self, op: str, path: str, *, deny_wins: bool) -> bool:
        """Seatbelt's decision, under one of the two orders it could apply (both must agree with us)."""
        verdicts = [
            action
            for action, ops, filters in self.rules
            if ops != ["default"] and _covers(ops, op) and any(_matches(f, path) for f in filters)
        ]
        if not verdicts:
            return False  # (deny default)
        if deny_wins:
            return "deny" not in verdicts
        return verdicts[-1] == "allow"


def test_every_profile_parses_and_denies_by_default() -> None:
    for name in POLICIES:
        forms = parse(profile_of(name))
        assert forms[0] == ["version", "1"] and forms[1] == ["deny", "default"], name


def test_names_are_escaped() -> None:
    text = build_profile(SandboxPolicy().with_no_access('work/a "quoted" (dir)\\x'), '/Users/a (b)/"ws"')
    parse(text)  # balanced despite the parentheses and quotes in the names
    assert '(subpath "/Users/a (b)/\\"ws\\"/work/a \\"quoted\\" (dir)\\\\x")' in text


@pytest.mark.parametrize("profile", [Profile.DANGER_FULL_ACCESS, Profile.EXTERNAL])
def test_unsandboxed_profiles_have_no_seatbelt_profile(profile: Profile) -> None:
    with pytest.raises(PolicyViolation):
        build_profile(SandboxPolicy(profile=profile), WS)


def test_unnameable_paths_are_refused() -> None:
    with pytest.raises(PolicyViolation):
        build_profile(SandboxPolicy(), "/Users/a\nb/ws")
    with pytest.raises(PolicyViolation):
        build_profile(SandboxPolicy(), "relative/ws")


def test_network_section() -> None:
    off = Profile_.of(profile_of("default"))
    on = Profile_.of(profile_of("network_on"))
    assert not any(_covers(ops, "network-outbound") for action, ops, _ in off.rules if action == "allow")
    assert any(ops == ["network-outbound"] for action, ops, _ in on.rules if action == "allow")
    assert not any(ops == ["system-socket"] for _, ops, _ in off.rules)  # no sockets to host daemons either


# -- meaning: the profile decides like SandboxPolicy.decide --------------------------------------------

WS_PATHS = [
    "notes.txt",
    "work/a.txt",
    "work/inputs/x",
    "out/r.csv",
    "out/ab.key",
    "out/zz.key",
    "skills/s/SKILL.md",
    "metadata.json",
    ".git/config",
    "work/repo/.git/hooks/pre-commit",
    "work/repo/main.py",
    "work/secret/key",
    "work/secret/pub/k.txt",
    "work/keys/id",
    "work/keys",
    "work/c/cert.pem",
    "home/.cache/x",
    "tmp/t",
    ".execspace/denied",
]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("deny_wins", [False, True], ids=["last-match-wins", "deny-wins"])
def test_workspace_decisions_match_the_policy(name: str, deny_wins: bool) -> None:
    policy, _ = POLICIES[name]
    sb = Profile_.of(profile_of(name))
    bound = dataclasses.replace(policy, home=HOME)  # as the generator binds it
    for rel in WS_PATHS:
        want = bound.access(WS, rel)
        path = f"{WS}/{rel}"
        got_read = sb.allowed("file-read-data", path, deny_wins=deny_wins)
        got_write = sb.allowed("file-write-data", path, deny_wins=deny_wins)
        assert (got_read, got_write) == (want.can_read, want.can_write), (rel, want)


@pytest.mark.parametrize("deny_wins", [False, True], ids=["last-match-wins", "deny-wins"])
def test_host_decisions(deny_wins: bool) -> None:
    sb = Profile_.of(profile_of("rules"))
    expect = {
        "/usr/lib/libSystem.B.dylib": (True, False),  # the platform's system view
        "/System/Library/Frameworks/X.framework/X": (True, False),
        "/opt/data/table.csv": (True, False),  # read grant
        "/opt/data/private/k": (False, False),  # no-access under it
        "/Users/alice/notes.md": (True, False),  # read grant on HOME...
        "/Users/alice/.ssh/id_rsa": (False, False),  # ...minus the credential stores
        "/Users/alice/.config/gcloud/creds.json": (False, False),
        "/Users/alice/scratch/out.txt": (True, True),  # write grant
        "/Users/bob/x": (False, False),  # nothing names it
        "/private/tmp/x": (False, False),  # host temp dirs are not shared
    }
    for path, (read, write) in expect.items():
        got = tuple(sb.allowed(op, path, deny_wins=deny_wins) for op in ("file-read-data", "file-write-data"))
        assert got == (read, write), path


def test_system_view_is_a_default_that_rules_override() -> None:
    policy = SandboxPolicy().with_write_paths("/usr/local").with_no_access("/opt/homebrew")
    sb = Profile_.of(build_profile(policy, WS))
    for deny_wins in (False, True):
        assert sb.allowed("file-write-data", "/usr/local/bin/tool", deny_wins=deny_wins)
        assert not sb.allowed("file-read-data", "/opt/homebrew/bin/python3", deny_wins=deny_wins)
        assert sb.allowed("file-read-data", "/usr/lib/libc.dylib", deny_wins=deny_wins)


def test_renames_that_would_carry_a_rule_away_are_denied() -> None:
    sb = Profile_.of(profile_of("rules"))
    for path in (f"{WS}/work", f"{WS}/work/keys", f"{WS}/work/secret"):
        assert not sb.allowed("file-write-unlink", path, deny_wins=False), path
    assert sb.allowed("file-write-unlink", f"{WS}/work/a.txt", deny_wins=False)
    nested = Profile_.of(profile_of("root_write"))
    assert not nested.allowed("file-write-unlink", f"{WS}/work/repo", deny_wins=False)  # leads to a protected .git
    assert nested.allowed("file-write-unlink", f"{WS}/work/other", deny_wins=False)


# -- globs: the regex means what wcmatch means ---------------------------------------------------------

GLOBS = [
    "**/*.pem",
    "*.key",
    "work/keys/**",
    "**/secrets",
    "a/**/b",
    "**",
    "a**b",
    "?x",
    "[!a]x",
    "[a-c]*.txt",
    "[]x]y",
    "file.(1)+",
    "we^ird$name{1}",
    "a\\*b",
    ".hidden/*",
    "[a/b]",
]
PATHS = [
    "x.pem",
    "a/x.pem",
    "a/.pem",
    ".a.pem",
    "a.pem/b",
    "k.key",
    "d/k.key",
    "work/keys",
    "work/keys/a",
    "work/keys/a/b",
    "secrets",
    "a/secrets",
    "a/secretsx",
    "a/b",
    "a/x/b",
    "a/x/y/b",
    "ab",
    "axyb",
    "a/xb",
    "ax",
    "bx",
    "/x",
    "b.txt",
    "d.txt",
    "xy",
    "]y",
    "file.(1)+",
    "file.11",
    "we^ird$name{1}",
    "a*b",
    "axb",
    ".hidden/f",
    ".hidden/d/f",
    "[a/b]",
]


@pytest.mark.parametrize("glob", GLOBS)
def test_glob_regex_agrees_with_wcmatch(glob: str) -> None:
    rx = re.compile(glob_to_regex(glob))
    for path in PATHS:
        want = wglob.globmatch(path, glob, flags=wglob.GLOBSTAR | wglob.DOTGLOB)
        assert (rx.fullmatch(path) is not None) == want, (glob, path)


@pytest.mark.parametrize("glob", GLOBS)
def test_glob_deny_regex_covers_matches_and_everything_below(glob: str) -> None:
    policy = SandboxPolicy().with_no_access_globs(glob)
    rx = re.compile(glob_deny_regex(WS, policy.no_access_globs[0]))
    for path in PATHS:
        if path.startswith("/"):
            continue
        assert (rx.search(f"{WS}/{path}") is not None) == (policy.glob_hit(path) is not None), (glob, path)
    assert rx.search(f"/elsewhere/{PATHS[0]}") is None


def test_unsupported_glob_classes_are_refused() -> None:
    for glob in ("[[:alpha:]]x", "[\\]]"):
        with pytest.raises(PolicyViolation):
            build_profile(SandboxPolicy().with_no_access_globs(glob), WS)


@pytest.mark.parametrize("profile", [Profile.WORKSPACE_WRITE, Profile.READ_ONLY])
async def test_the_seatbelt_wrapper_puts_the_run_under_sandbox_exec(tmp_path: Path, profile: Profile) -> None:
    """On any OS: the seatbelt runner's plan is the host runner's, under ``sandbox-exec -p`` with the profile
    build_profile makes for the run's network; a read-only workspace's temporary files go to a private directory
    that the run's end removes."""
    import execspace
    from execspace import RunProgramSpec
    from execspace.backends.sandbox.seatbelt import SANDBOX_EXEC, seatbelt_runner

    policy = SandboxPolicy(profile=profile)
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as engine:
        caps = engine.describe()
        ws = await engine.manager.create_workspace("seatbelt")
        runner = seatbelt_runner(
            policy, network_default=False, capabilities=lambda: caps, env_policy=None, kill_grace=1
        )
        prep = runner.prepare(ws, RunProgramSpec("/bin/echo", ["hi"]))
        launch = runner.wrap(prep)
    root = os.path.realpath(prep.root)
    tmpdir = launch.env.get("TMPDIR") if profile is Profile.READ_ONLY else None
    assert list(launch.argv) == [
        SANDBOX_EXEC,
        "-p",
        build_profile(policy.with_network(False), root, tmpdir=tmpdir),
        "--",
        "/bin/echo",
        "hi",
    ]
    assert launch.cwd == prep.host_cwd and launch.marker == prep.marker
    if profile is Profile.WORKSPACE_WRITE:  # its tmp/ is writable: the environment is the run's own
        assert launch.env == prep.env
        return
    assert tmpdir is not None and os.path.isdir(tmpdir) and launch.env["TMP"] == launch.env["TEMP"] == tmpdir
    launch.stack.close()  # the run is over
    assert not os.path.exists(tmpdir)
