"""Skills: discovery on the host, read-only staging into workspaces, running their scripts.

Everything that touches a workspace runs on the local and the sandbox backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine, PathDenied, UsageError, Workspace
from execspace.tools.schema import Tool
from execspace.tools.skills import (
    SKILL_NAME_PATTERN,
    SkillLibrary,
    SkillListTool,
    SkillNotFound,
    SkillRunTool,
    parse_skill_md,
    skill_digest,
)
from execspace.workspace.metadata import WorkspaceMetadata
from tests.bindings import BACKENDS, open_backend

pytestmark = pytest.mark.timeout(60)

GREET = '#!/bin/sh\necho "hello, $1"\n'
MAIN_SH = """greet "$@"
pwd
echo "skill=$SKILL_NAME dir=$SKILL_DIR"
greet file > "$OUTPUT_DIR/greeting.txt"
"""
TOOL = "#!/bin/sh\necho direct $#\n"
CALC_PY = """import sys
if "--fail" in sys.argv:
    sys.exit("calc failed")
print(sum(int(a) for a in sys.argv[1:]))
"""


def write_skill(root: Path, name: str, description: str = "Greets.", files: dict[str, str] | None = None) -> Path:
    """A skill folder with ``files`` (relative path -> text); files in bin/ or without a suffix are executable."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n# {name}\nUse it.\n")
    for rel, content in (files or {}).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o755 if rel.startswith("bin/") or not path.suffix else 0o644)
    return folder


@pytest.fixture
def skill_root(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    files = {"bin/greet": GREET, "scripts/main.sh": MAIN_SH, "scripts/calc.py": CALC_PY, "scripts/tool": TOOL}
    write_skill(root, "hello", files=files)
    return root


@pytest.fixture
def library(skill_root: Path) -> SkillLibrary:
    return SkillLibrary([skill_root])


@pytest.fixture(params=BACKENDS)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path, skill_root: Path) -> AsyncIterator[BaseEngine]:
    async with open_backend(request, request.param, tmp_path, [skill_root]) as engine:
        yield engine


@pytest.fixture
async def ws(any_engine: BaseEngine) -> Workspace:
    return await any_engine.manager.create_workspace("skills/user/session")


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


def recorded(ws: Workspace) -> WorkspaceMetadata:
    return WorkspaceMetadata.from_json((host(ws) / "metadata.json").read_bytes())


# -- SKILL.md ---------------------------------------------------------------------------


def test_parse_reads_front_matter_and_body_with_crlf_bom_and_folded_description() -> None:
    text = (
        "\ufeff---\r\nname: pdf-tools\r\ndescription: >\r\n  Extract text\r\n  from PDFs.\r\n"
        "license: MIT\r\nmetadata:\r\n  version: 2\r\n---\r\n# PDF\r\nbody\r\n"
    )
    front, body = parse_skill_md(text)
    assert front["name"] == "pdf-tools"
    assert front["description"] == "Extract text from PDFs.\n"
    assert front["metadata"] == {"version": 2} and front["license"] == "MIT"
    assert body == "# PDF\r\nbody\r\n"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("name: x\ndescription: y\n", "must start with a '---'"),
        ("---\nname: x\ndescription: y\n", "not closed"),
        ("---\nname: [x\n---\n", "not valid YAML"),
        ("---\n- a\n- b\n---\n", "mapping"),
        ("---\n1: x\n---\n", "string keys"),
        ("---\ndescription: y\n---\n", "needs 'name'"),
        ("---\nname: Hello\ndescription: y\n---\n", "invalid skill name"),
        ("---\nname: -x\ndescription: y\n---\n", "invalid skill name"),
        ("---\nname: a/b\ndescription: y\n---\n", "invalid skill name"),
        (f"---\nname: {'a' * 65}\ndescription: y\n---\n", "invalid skill name"),
        ("---\nname: x\n---\n", "needs 'description'"),
        ("---\nname: x\ndescription: '  '\n---\n", "needs 'description'"),
        ("---\nname: x\ndescription: [1, 2]\n---\n", "needs 'description'"),
        (f"---\nname: x\ndescription: {'d' * 1025}\n---\n", "longer than 1024"),
        ("---\nname: x\ndescription: !!python/object:os.system y\n---\n", "not valid YAML"),
    ],
)
def test_parse_rejects_with_the_rule_broken(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_skill_md(text)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a", True), ("0-x_y", True), ("pdf-tools", True), ("_x", False), ("A", False), ("x.y", False), ("", False)],
)
def test_name_pattern(name: str, ok: bool) -> None:
    assert bool(SKILL_NAME_PATTERN.match(name)) is ok


# -- discovery --------------------------------------------------------------------------


def test_discovery_keeps_valid_skills_and_reports_the_rest(tmp_path: Path) -> None:
    first, second = tmp_path / "r1", tmp_path / "r2"
    write_skill(first, "hello")
    write_skill(first, "other", "Does other things.")
    write_skill(first, "mismatch")
    (first / "mismatch" / "SKILL.md").write_text("---\nname: elsewhere\ndescription: d\n---\n")
    (first / "no-md").mkdir()
    write_skill(first, "broken")
    (first / "broken" / "SKILL.md").write_text("---\nname: broken\ndescription: [oops\n---\n")
    write_skill(first, "linked")
    (first / "linked" / "SKILL.md").unlink()
    (first / "linked" / "SKILL.md").symlink_to(first / "hello" / "SKILL.md")
    write_skill(first, ".git")
    (first / "README.md").write_text("not a skill")
    write_skill(second, "hello", "A second hello.")
    write_skill(second, "third", "Third.")

    lib = SkillLibrary([first, tmp_path / "missing", second])

    assert sorted(lib.skills) == ["hello", "other", "third"]
    assert lib.get("hello").description == "Greets."  # the earlier root wins
    reasons = {p.path.name: p.reason for p in lib.problems}
    assert set(reasons) == {"mismatch", "no-md", "broken", "linked", "missing", "hello"}
    assert "folder is 'mismatch'" in reasons["mismatch"]
    assert "no SKILL.md" in reasons["no-md"]
    assert "not valid YAML" in reasons["broken"]
    assert "symlink" in reasons["linked"]
    assert "cannot list" in reasons["missing"]
    assert "duplicate skill name 'hello'" in reasons["hello"]


def test_list_for_model_gives_name_and_description_sorted(tmp_path: Path) -> None:
    write_skill(tmp_path, "zeta", "Last.")
    write_skill(tmp_path, "alpha", "First.")
    assert SkillLibrary([tmp_path]).list_for_model() == [
        {"name": "alpha", "description": "First."},
        {"name": "zeta", "description": "Last."},
    ]


def test_refresh_sees_new_and_removed_skills(tmp_path: Path) -> None:
    lib = SkillLibrary([tmp_path])
    assert lib.skills == {}
    write_skill(tmp_path, "new")
    lib.refresh()
    assert list(lib.skills) == ["new"]
    shutil.rmtree(tmp_path / "new")
    lib.refresh()
    assert lib.skills == {}
    with pytest.raises(SkillNotFound, match="unknown skill 'new'"):
        lib.get("new")


def test_library_refuses_a_single_path_instead_of_a_list(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        SkillLibrary(tmp_path)  # type: ignore[arg-type]


def test_digest_follows_content_exec_bits_and_names_not_mtime(skill_root: Path) -> None:
    folder = skill_root / "hello"
    base = skill_digest(folder)
    os.utime(folder / "SKILL.md", (1, 1))
    assert skill_digest(folder) == base
    (folder / "scripts" / "calc.py").chmod(0o755)
    assert skill_digest(folder) != base
    (folder / "scripts" / "calc.py").chmod(0o644)
    assert skill_digest(folder) == base
    (folder / "scripts" / "calc.py").rename(folder / "scripts" / "calc2.py")
    assert skill_digest(folder) != base


# -- staging (both backends) ------------------------------------------------------------


async def test_stage_copies_read_only_and_records_the_digest(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary, skill_root: Path
) -> None:
    [staged] = await library.stage(any_engine, ws, ["hello"])
    assert (staged.name, staged.dest, staged.copied) == ("hello", "skills/hello", True)
    copy = host(ws) / "skills" / "hello"
    for rel in ("SKILL.md", "bin/greet", "scripts/main.sh", "scripts/calc.py"):
        assert (copy / rel).read_bytes() == (skill_root / "hello" / rel).read_bytes()
        assert (copy / rel).stat().st_mode & 0o222 == 0, rel
    assert (copy / "bin" / "greet").stat().st_mode & 0o111
    rec = recorded(ws).skills["hello"]
    assert rec["digest"] == staged.digest == skill_digest(skill_root / "hello")
    assert rec["source"] == str((skill_root / "hello").resolve())


async def test_restaged_only_when_the_folder_changed(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary, skill_root: Path
) -> None:
    await library.stage(any_engine, ws, ["hello"])
    staged_md = host(ws) / "skills" / "hello" / "SKILL.md"
    before = staged_md.stat()

    [again] = await library.stage(any_engine, ws, ["hello"])
    assert not again.copied
    after = staged_md.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    (skill_root / "hello" / "scripts" / "calc.py").write_text("print('v2')\n")
    (skill_root / "hello" / "scripts" / "main.sh").unlink()
    [changed] = await library.stage(any_engine, ws, ["hello"])
    assert changed.copied and changed.digest != again.digest
    copy = host(ws) / "skills" / "hello"
    assert (copy / "scripts" / "calc.py").read_text() == "print('v2')\n"
    assert not (copy / "scripts" / "main.sh").exists()  # deleted at the source, gone from the copy
    assert recorded(ws).skills["hello"]["digest"] == changed.digest

    [forced] = await library.stage(any_engine, ws, ["hello"], force=True)
    assert forced.copied


async def test_restaged_when_the_staged_copy_is_gone(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    await library.stage(any_engine, ws)
    shutil.rmtree(host(ws) / "skills" / "hello")
    [staged] = await library.stage(any_engine, ws)
    assert staged.copied and (host(ws) / "skills" / "hello" / "SKILL.md").is_file()


async def test_concurrent_stages_copy_once(any_engine: BaseEngine, ws: Workspace, library: SkillLibrary) -> None:
    results = await asyncio.gather(*(library.stage(any_engine, ws, ["hello"]) for _ in range(4)))
    assert sorted(r[0].copied for r in results) == [False, False, False, True]


async def test_unknown_skill_is_refused_before_anything_is_staged(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    with pytest.raises(SkillNotFound, match="known skills: hello"):
        await library.stage(any_engine, ws, ["hello", "nope"])
    assert not (host(ws) / "skills" / "hello").exists()


async def test_a_skill_folder_removed_after_discovery_is_reported(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary, skill_root: Path
) -> None:
    shutil.rmtree(skill_root / "hello")
    with pytest.raises(SkillNotFound, match="is gone; refresh the library"):
        await library.stage(any_engine, ws, ["hello"])
    _, tool = library.tools(any_engine, ws)
    out = await tool.call({"skill": "hello", "script": "bin/greet"})
    assert (out["status"], out["error_type"]) == ("error", "SkillNotFound")


@pytest.mark.parametrize("name", BACKENDS)
async def test_staging_needs_the_skill_root_in_host_roots(
    request: pytest.FixtureRequest, name: str, tmp_path: Path, skill_root: Path
) -> None:
    async with open_backend(request, name, tmp_path, [tmp_path / "elsewhere"]) as engine:
        ws = await engine.manager.create_workspace("skills/denied")
        with pytest.raises(PathDenied, match="host_roots including the skill roots") as info:
            await SkillLibrary([skill_root]).stage(engine, ws, ["hello"])
        assert info.value.path == str((skill_root / "hello").resolve())
        assert not (host(ws) / "skills" / "hello").exists()
        assert not (host(ws) / "metadata.json").exists() or "hello" not in recorded(ws).skills


@pytest.mark.parametrize("name", BACKENDS)
async def test_a_refused_restage_keeps_the_current_copy(
    request: pytest.FixtureRequest, name: str, tmp_path: Path, skill_root: Path
) -> None:
    library = SkillLibrary([skill_root])
    async with open_backend(request, name, tmp_path, [skill_root]) as engine:
        ws = await engine.manager.create_workspace("skills/kept")
        [first] = await library.stage(engine, ws, ["hello"])
    (skill_root / "hello" / "scripts" / "calc.py").write_text("print('v2')\n")
    # the same workspace, the root no longer allowed
    async with open_backend(request, name, tmp_path, [tmp_path / "elsewhere"]) as engine:
        ws = await engine.manager.create_workspace("skills/kept")
        with pytest.raises(PathDenied, match="host_roots including the skill roots"):
            await library.stage(engine, ws, ["hello"])
    assert (host(ws) / "skills" / "hello" / "scripts" / "calc.py").read_text() == CALC_PY
    assert recorded(ws).skills["hello"]["digest"] == first.digest


async def test_staged_skills_are_read_only_inside_the_sandbox(
    request: pytest.FixtureRequest, tmp_path: Path, skill_root: Path
) -> None:
    async with open_backend(request, "sandbox", tmp_path, [skill_root]) as engine:
        ws = await engine.manager.create_workspace("skills/ro")
        await SkillLibrary([skill_root]).stage(engine, ws, ["hello"])
        staged = host(ws) / "skills" / "hello"
        original = (staged / "SKILL.md").read_bytes()
        attack = (
            'cd "$SKILLS_DIR/hello"; cat SKILL.md >/dev/null && echo readable; '
            "echo pwned > SKILL.md && echo wrote; chmod u+w SKILL.md && echo chmod; "
            "touch new && echo created; rm -f bin/greet && echo removed; mv scripts gone && echo moved; "
            'touch "$SKILLS_DIR/planted" && echo planted; true'
        )
        r = await engine.runner.run_program(ws, execspace.RunProgramSpec("sh", ["-c", attack]))
        assert r.stdout.split() == ["readable"], r.stdout + r.stderr
        assert (staged / "SKILL.md").read_bytes() == original == (skill_root / "hello" / "SKILL.md").read_bytes()
        assert sorted(p.name for p in staged.iterdir()) == ["SKILL.md", "bin", "scripts"]
        assert (staged / "bin" / "greet").is_file() and not (host(ws) / "skills" / "planted").exists()


# -- running (both backends) ------------------------------------------------------------


async def test_run_skill_puts_bin_on_path_runs_in_work_and_reaches_out(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    r = await library.run_skill(any_engine, ws, "hello", "scripts/main.sh", ["world"])
    assert r.exit_code == 0, r.stderr
    greeting, cwd, env = r.stdout.splitlines()
    assert greeting == "hello, world"
    assert cwd == f"{ws.path}/work"
    assert env == f"skill=hello dir={ws.path}/skills/hello"
    assert (host(ws) / "out" / "greeting.txt").read_text() == "hello, file\n"


async def test_run_skill_stages_on_demand_and_runs_python_with_args(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    r = await library.run_skill(any_engine, ws, "hello", "scripts/calc.py", ["1", "2", "39"])
    assert (r.exit_code, r.stdout) == (0, "42\n")
    assert "hello" in recorded(ws).skills
    failed = await library.run_skill(any_engine, ws, "hello", "scripts/calc.py", ["1", "--fail"], timeout=30)
    assert (failed.exit_code, failed.stderr) == (1, "calc failed\n")  # a failure is data, not an exception


async def test_run_skill_executes_other_files_directly_with_args_verbatim(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    r = await library.run_skill(any_engine, ws, "hello", "scripts/tool", ["a b", "$(id)", ";"])
    assert r.stdout == "direct 3\n"
    r = await library.run_skill(any_engine, ws, "hello", "bin/greet", ["$HOME `id`"])
    assert r.stdout == "hello, $HOME `id`\n"


async def test_run_skill_refuses_unknown_skills_and_paths_outside_the_skill(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    with pytest.raises(SkillNotFound, match="unknown skill"):
        await library.run_skill(any_engine, ws, "nope", "x.py")
    with pytest.raises(SkillNotFound, match=r"has no file 'scripts/missing\.py'"):
        await library.run_skill(any_engine, ws, "hello", "scripts/missing.py")
    with pytest.raises(SkillNotFound):
        await library.run_skill(any_engine, ws, "hello", "scripts")
    for bad in ("../../metadata.json", "/etc/passwd", "scripts/../../../out/x"):
        with pytest.raises(PathDenied):
            await library.run_skill(any_engine, ws, "hello", bad)
    with pytest.raises(UsageError):
        await library.run_skill(any_engine, ws, "hello", "scripts/calc.py", "1 2")


# -- model tools (both backends) --------------------------------------------------------


async def test_skill_list_tool(library: SkillLibrary) -> None:
    tool = SkillListTool(library)
    assert tool.spec.anthropic()["name"] == "skill_list"
    assert await tool.call({}) == {"status": "ok", "skills": [{"name": "hello", "description": "Greets."}]}
    one = await tool.call({"name": "hello"})
    assert one["instructions"] == "# hello\nUse it.\n" and not one["instructions_truncated"]
    missing = await tool.call({"name": "nope"})
    assert missing["status"] == "error" and missing["error_type"] == "SkillNotFound"
    assert (await tool.call({"bogus": 1}))["error_type"] == "InvalidArguments"


async def test_skill_run_tool_reports_output_and_new_files(
    any_engine: BaseEngine, ws: Workspace, library: SkillLibrary
) -> None:
    listing, tool = library.tools(any_engine, ws)
    tools: list[Tool] = [listing, tool]
    assert all(isinstance(t, Tool) for t in tools)
    spec = tool.spec.openai()["function"]
    assert spec["name"] == "skill_run" and spec["parameters"]["properties"]["skill"]["enum"] == ["hello"]
    out = await tool.call({"skill": "hello", "script": "scripts/main.sh", "args": ["model"]})
    json.dumps(out)  # JSON-ready
    assert (out["status"], out["exit_code"], out["timed_out"]) == ("exited", 0, False)
    assert out["stdout"].startswith("hello, model\n") and "stdout_truncated" not in out
    assert [(f["path"], f["change"]) for f in out["files"]] == [("out/greeting.txt", "created")]
    again = await tool.call({"skill": "hello", "script": "scripts/calc.py", "args": ["1"]})
    assert again["stdout"] == "1\n" and again["files"] == []  # nothing written under out/ this time
    rewrite = await tool.call({"skill": "hello", "script": "scripts/main.sh"})
    assert [(f["path"], f["change"]) for f in rewrite["files"]] == [("out/greeting.txt", "modified")]
    bad = await tool.call({"skill": "hello", "script": "../x"})
    assert bad["status"] == "error" and bad["error_type"] == "PathDenied"
    assert (await tool.call({"skill": "other", "script": "x"}))["error_type"] == "InvalidArguments"


async def test_skill_run_tool_keeps_output_within_the_budget(
    any_engine: BaseEngine, ws: Workspace, skill_root: Path
) -> None:
    write_skill(skill_root, "loud", "Prints a lot.", {"bin/flood": "#!/bin/sh\nseq 1 20000\n"})
    lib = SkillLibrary([skill_root])
    tool = SkillRunTool(lib, any_engine, ws, output_budget=1000)
    out = await tool.call({"skill": "loud", "script": "bin/flood"})
    assert out["stdout_truncated"] and out["stdout_total_bytes"] == len("".join(f"{i}\n" for i in range(1, 20001)))
    assert out["stdout"].startswith("1\n2\n") and out["stdout"].endswith("19999\n20000\n")
    assert "bytes omitted" in out["stdout"] and len(out["stdout"].encode()) < 1000 + 100


async def test_skill_run_tool_times_out(any_engine: BaseEngine, ws: Workspace, skill_root: Path) -> None:
    write_skill(skill_root, "slow", "Sleeps.", {"bin/nap": "#!/bin/sh\necho start\nsleep 30\n"})
    tool = SkillRunTool(SkillLibrary([skill_root]), any_engine, ws)
    out = await tool.call({"skill": "slow", "script": "bin/nap", "timeout_sec": 1})
    assert (out["status"], out["timed_out"], out["stdout"]) == ("exited", True, "start\n")


async def test_skill_run_spec_follows_the_library(any_engine: BaseEngine, ws: Workspace, skill_root: Path) -> None:
    lib = SkillLibrary([skill_root])
    _, tool = lib.tools(any_engine, ws)
    write_skill(skill_root, "later", "Added later.", {"bin/hi": "#!/bin/sh\necho later\n"})
    assert tool.spec.parameters["properties"]["skill"]["enum"] == ["hello"]
    lib.refresh()
    assert tool.spec.parameters["properties"]["skill"]["enum"] == ["hello", "later"]
    assert (await tool.call({"skill": "later", "script": "bin/hi"}))["stdout"] == "later\n"
