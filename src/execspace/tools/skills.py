"""Skills: folders of instructions and scripts that an agent can stage into a workspace and run.

A skill is a directory holding a ``SKILL.md`` whose YAML front matter names it and
says what it is for (the format of Agent Skills)::

    pdf-tools/
      SKILL.md          ---\\nname: pdf-tools\\ndescription: Extract text and tables from PDFs.\\n---\\n# How to…
      bin/pdftext       commands put on PATH while the skill's scripts run
      scripts/extract.py

::

    library = SkillLibrary(["/opt/skills"])          # engine opened with host_roots=["/opt/skills"]
    library.list_for_model()                         # [{"name": "pdf-tools", "description": "…"}]
    await library.stage(engine, ws, ["pdf-tools"])   # copied read-only to skills/pdf-tools (only if changed)
    result = await library.run_skill(engine, ws, "pdf-tools", "scripts/extract.py", ["inputs/a.pdf"])

The exact rules (name syntax, front matter, staging, the environment of a run) are
in ``docs/tools/skills.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import posixpath
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import ExecspaceError, InputError, InvalidSpec, LimitExceeded, PathDenied, UnsupportedLanguage, UsageError
from ..languages import LANGUAGES, Language, pick_runtime
from ..models import ResourceLimits, RunProgramSpec, RunResult, Workspace
from ..process.capture import clip_text
from ..protocols import Engine, WorkspaceFS
from ..workspace import HostRoots, load_ws_metadata, save_ws_metadata, split_relpath
from .execute_code import MAX_FILES_LISTED
from .schema import ToolArguments, ToolSpec, check_arguments, error_result
from .workspace_io import FileChange, WorkspaceIO

__all__ = [
    "DEFAULT_SKILL_OUTPUT_BUDGET",
    "SKILL_FILE",
    "SKILL_NAME_PATTERN",
    "SKILL_RUN_TIMEOUT",
    "Skill",
    "SkillLibrary",
    "SkillListTool",
    "SkillNotFound",
    "SkillProblem",
    "SkillRunTool",
    "StagedSkill",
    "parse_skill_md",
    "skill_digest",
]

SKILL_FILE = "SKILL.md"
#: Valid skill names: lower-case letters, digits, ``-`` and ``_``; not starting with ``-`` or ``_``.
SKILL_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-_]*$")
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
#: Largest ``SKILL.md`` read; a bigger one is reported as a problem.
MAX_SKILL_MD_BYTES = 256 * 1024
#: Caps on what one skill folder may hold (checked while computing its digest, before any copy).
MAX_SKILL_FILES = 10_000
MAX_SKILL_BYTES = 64 * 1024 * 1024
#: Default deadline of ``run_skill``, in seconds.
SKILL_RUN_TIMEOUT = 300.0
#: Bytes of stdout and of stderr kept (each) in the model-facing output of ``skill_run``.
DEFAULT_SKILL_OUTPUT_BUDGET = 16 * 1024

_SKILLS_DIR = "skills"
# The skill's bin/ goes first on PATH *inside* the run: the runner's PATH (its env policy, and what
# the sandbox can see) is only known there, and "$@" carries the argv without any shell parsing.
_PATH_PREPEND = 'PATH="$1${PATH:+:$PATH}"; export PATH; shift; exec "$@"'


class SkillNotFound(UsageError, LookupError):
    """No valid skill with that name in the library, or no such script in the skill."""


@dataclass(frozen=True, slots=True)
class Skill:
    """One valid skill found on the host."""

    name: str
    description: str
    path: Path
    """The skill folder, resolved (symlinks followed): what staging copies."""
    instructions: str = ""
    """The Markdown body of ``SKILL.md`` after the front matter."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The whole front matter, including keys other than name and description."""


@dataclass(frozen=True, slots=True)
class SkillProblem:
    """A folder that looked like a skill (or a root) but could not be used, and why."""

    path: Path
    reason: str


@dataclass(frozen=True, slots=True)
class StagedSkill:
    """What :meth:`SkillLibrary.stage` did for one skill."""

    name: str
    dest: str
    """Workspace-relative directory: ``skills/<name>``."""
    digest: str
    copied: bool
    """True when the folder was (re)copied now; False when the staged copy was already current."""


# -- SKILL.md -------------------------------------------------------------------------


def parse_skill_md(text: str) -> tuple[dict[str, Any], str]:
    """Split ``SKILL.md`` into its front matter (a YAML mapping) and its Markdown body.

    The file must start with a line ``---`` (a UTF-8 BOM is ignored), then YAML, then a
    line ``---``. ``name`` and ``description`` must be non-empty strings; the name must
    match :data:`SKILL_NAME_PATTERN` and be at most 64 characters, the description at
    most 1024.

    Raises:
        ValueError: the text breaks one of these rules (the message says which).
    """
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != "---":
        raise ValueError(f"{SKILL_FILE} must start with a '---' line opening the YAML front matter")
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip("\r\n") == "---"), None)
    if end is None:
        raise ValueError(f"the front matter of {SKILL_FILE} is not closed by a '---' line")
    try:
        front = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise ValueError(f"the front matter is not valid YAML: {exc}") from None
    if not isinstance(front, dict) or not all(isinstance(k, str) for k in front):
        raise ValueError("the front matter must be a YAML mapping with string keys")
    _check_front_matter(front)
    return front, "".join(lines[end + 1 :])


def _check_front_matter(front: Mapping[str, Any]) -> None:
    name, description = front.get("name"), front.get("description")
    if not isinstance(name, str) or not name:
        raise ValueError("front matter needs 'name' (a string)")
    if not SKILL_NAME_PATTERN.match(name) or len(name) > MAX_NAME_CHARS:
        raise ValueError(
            f"invalid skill name {name!r}: use at most {MAX_NAME_CHARS} of a-z 0-9 - _, starting with a letter or digit"
        )
    if not isinstance(description, str) or not description.strip():
        raise ValueError("front matter needs 'description' (a non-empty string)")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ValueError(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")


def _load_skill(folder: Path) -> Skill:
    """Read one skill folder; ``ValueError`` says why it is not a valid skill."""
    md = folder / SKILL_FILE
    try:
        # no symlink: staging skips symlinks, so a linked SKILL.md would never reach the workspace
        fd = os.open(md, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"no {SKILL_FILE} in the folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{SKILL_FILE} is a symlink; it must be a regular file") from None
        raise ValueError(f"cannot open {SKILL_FILE}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{SKILL_FILE} is not a regular file")
        raw = f.read(MAX_SKILL_MD_BYTES + 1)
    if len(raw) > MAX_SKILL_MD_BYTES:
        raise ValueError(f"{SKILL_FILE} is larger than {MAX_SKILL_MD_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{SKILL_FILE} is not UTF-8") from None
    front, body = parse_skill_md(text)
    if front["name"] != folder.name:
        raise ValueError(f"the skill is named {front['name']!r} but its folder is {folder.name!r}; they must match")
    return Skill(front["name"], front["description"].strip(), folder.resolve(), body, front)


# -- digest ---------------------------------------------------------------------------


def skill_digest(folder: Path) -> str:
    """``sha256:…`` over what staging copies: directories, regular files, their content and exec bits.

    Symlinks and special files are left out, as :meth:`WorkspaceFS.stage_directory` skips them.

    Raises:
        LimitExceeded: more than 10,000 files or 64 MiB in the folder.
    """
    h = hashlib.sha256()
    budget = [MAX_SKILL_FILES, MAX_SKILL_BYTES]
    _digest_dir(folder, "", h, budget)
    return f"sha256:{h.hexdigest()}"


def _digest_dir(path: Path, rel: str, h: Any, budget: list[int]) -> None:
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        st = e.stat(follow_symlinks=False)
        name = f"{rel}{e.name}"
        if stat.S_ISDIR(st.st_mode):
            h.update(f"d {json.dumps(name)}\n".encode())
            _digest_dir(Path(e.path), f"{name}/", h, budget)
        elif stat.S_ISREG(st.st_mode):
            budget[0] -= 1
            budget[1] -= st.st_size
            if budget[0] < 0 or budget[1] < 0:
                raise LimitExceeded(
                    f"skill folder {str(path)!r} holds more than {MAX_SKILL_FILES} files or "
                    f"{MAX_SKILL_BYTES} bytes; keep data out of skills"
                )
            h.update(f"f {json.dumps(name)} {st.st_mode & 0o111:o} {_file_sha256(Path(e.path))}\n".encode())


def _file_sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- the library ----------------------------------------------------------------------


class SkillLibrary:
    """The valid skills below some host directories, with problems reported, never raised.

    Each *root* is a directory whose immediate sub-directories are skills. Discovery
    runs on construction and on :meth:`refresh` (synchronous file reads). When two
    roots hold a skill of the same name, the earlier root wins and the later one is a
    problem. The engine that stages skills must have been opened with ``host_roots``
    covering the skill folders (``host_roots=library.roots``).
    """

    def __init__(self, roots: Sequence[Path | str]) -> None:
        if isinstance(roots, str | Path):
            raise UsageError("SkillLibrary takes a list of root directories, not one path")
        self.roots = tuple(Path(r) for r in roots)
        self._skills: dict[str, Skill] = {}
        self._problems: list[SkillProblem] = []
        self.refresh()

    def refresh(self) -> None:
        """Discover the skills again (folders added, removed or edited since)."""
        skills: dict[str, Skill] = {}
        problems: list[SkillProblem] = []
        for root in self.roots:
            try:
                folders = sorted(p for p in root.iterdir() if p.is_dir())
            except OSError as exc:
                problems.append(SkillProblem(root, f"cannot list the skill root: {exc.strerror or exc}"))
                continue
            for folder in folders:
                self._discover(folder, skills, problems)
        self._skills, self._problems = skills, problems

    @staticmethod
    def _discover(folder: Path, skills: dict[str, Skill], problems: list[SkillProblem]) -> None:
        if folder.name.startswith("."):
            return  # .git, editor folders: never skills, not worth a report
        try:
            skill = _load_skill(folder)
        except ValueError as exc:
            problems.append(SkillProblem(folder, str(exc)))
            return
        if skill.name in skills:
            problems.append(
                SkillProblem(folder, f"duplicate skill name {skill.name!r} (first: {skills[skill.name].path})")
            )
            return
        skills[skill.name] = skill

    @property
    def skills(self) -> Mapping[str, Skill]:
        """The valid skills by name."""
        return dict(self._skills)

    @property
    def problems(self) -> tuple[SkillProblem, ...]:
        """Folders that are not valid skills, with the reason."""
        return tuple(self._problems)

    def get(self, name: str) -> Skill:
        skill = self._skills.get(name)
        if skill is None:
            known = ", ".join(sorted(self._skills)) or "none"
            raise SkillNotFound(f"unknown skill {name!r}; known skills: {known}")
        return skill

    def list_for_model(self) -> list[dict[str, str]]:
        """``[{"name", "description"}]`` for every valid skill, sorted by name."""
        return [{"name": s.name, "description": s.description} for s in sorted(self._skills.values(), key=_by_name)]

    # -- staging --------------------------------------------------------------------

    async def stage(
        self, engine: Engine, ws: Workspace, names: Sequence[str] | None = None, *, force: bool = False
    ) -> list[StagedSkill]:
        """Copy skills read-only into ``skills/<name>``, skipping those whose staged copy is current.

        A skill is copied again only when the digest of its host folder differs from
        the one recorded in the workspace metadata (``skills``), when its staged copy is
        gone, or with ``force``; the old copy is removed first so deleted files go too.
        ``names=None`` stages every skill.

        Raises:
            SkillNotFound: a name is not a valid skill of this library.
            PathDenied: the skill folder is outside the engine's ``host_roots``.
            LimitExceeded: a skill folder is too large.
        """
        skills = [self.get(n) for n in (sorted(self._skills) if names is None else names)]
        fs = engine.fs
        done: list[StagedSkill] = []
        # the fs's locks also serialise input staging and output collection on the same record
        async with fs.locks.lock(ws):
            meta = await load_ws_metadata(fs, ws)
            try:
                for skill in skills:
                    done.append(await self._stage_one(fs, ws, skill, meta.skills, force))
            finally:
                if any(d.copied for d in done) or meta.recovered_from or len(done) < len(skills):
                    await save_ws_metadata(fs, ws, meta)
        return done

    async def _stage_one(
        self, fs: WorkspaceFS, ws: Workspace, skill: Skill, records: dict[str, dict[str, Any]], force: bool
    ) -> StagedSkill:
        dest = f"{_SKILLS_DIR}/{skill.name}"
        digest = await _host_digest(skill)
        record = records.get(skill.name)
        present = await _staged_copy_present(fs, ws, dest)
        if not force and present and record is not None and record.get("digest") == digest:
            return StagedSkill(skill.name, dest, digest, copied=False)
        _check_host_root(fs, skill)  # before the old copy is removed: a refused skill leaves it in place
        records.pop(skill.name, None)  # until the new copy is complete, nothing current is staged
        if present or record is not None:
            await _remove_tree(fs, ws, dest)
        await fs.stage_directory(ws, skill.path, dest, read_only=True)
        records[skill.name] = {"digest": digest, "source": str(skill.path), "staged_at": time.time()}
        return StagedSkill(skill.name, dest, digest, copied=True)

    # -- running --------------------------------------------------------------------

    async def run_skill(
        self,
        engine: Engine,
        ws: Workspace,
        name: str,
        script: str,
        args: Sequence[str] = (),
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        # the runner enforces it by killing the process tree; asyncio.timeout would only stop waiting
        timeout: float | None = SKILL_RUN_TIMEOUT,  # noqa: ASYNC109
        limits: ResourceLimits | None = None,
    ) -> RunResult:
        """Run ``script`` (a path inside the skill) with ``args``; stage the skill first if needed.

        The working directory is ``work/``; ``skills/<name>/bin`` comes first on PATH;
        ``SKILL_NAME`` and ``SKILL_DIR`` are set, as are the workspace variables
        (``OUTPUT_DIR``, ``WORK_DIR``…). ``.py``, ``.sh``, ``.js`` and ``.ts`` scripts
        run with their language's runtime; anything else is executed directly. A
        non-zero exit is data (:class:`~execspace.models.RunResult`).

        Raises:
            SkillNotFound: unknown skill, or no such file in it.
            PathDenied: ``script`` leaves the skill (``..``, absolute path).
            UnsupportedLanguage: no runtime for the script's language on this backend.
        """
        if isinstance(args, str):
            raise UsageError("args must be a sequence of strings, not one string")
        await self.stage(engine, ws, [name])
        rel = "/".join(split_relpath(script))
        skill_dir = posixpath.join(ws.path, _SKILLS_DIR, name)
        await _require_script(engine.fs, ws, name, rel)
        argv = [*_interpreter(engine, ws, rel), posixpath.join(skill_dir, rel), *args]
        spec = RunProgramSpec(
            "sh",
            ["-c", _PATH_PREPEND, "skill-run", posixpath.join(skill_dir, "bin"), *argv],
            env={**(env or {}), "SKILL_NAME": name, "SKILL_DIR": skill_dir},
            cwd="work",
            stdin=stdin,
            timeout=timeout,
            limits=limits or ResourceLimits(),
        )
        return await engine.runner.run_program(ws, spec)

    # -- model tools ----------------------------------------------------------------

    def tools(
        self, engine: Engine, ws: Workspace, *, output_budget: int = DEFAULT_SKILL_OUTPUT_BUDGET
    ) -> tuple[SkillListTool, SkillRunTool]:
        """The ``skill_list`` and ``skill_run`` tools bound to one workspace."""
        return SkillListTool(self), SkillRunTool(self, engine, ws, output_budget=output_budget)


async def _host_digest(skill: Skill) -> str:
    try:
        return await asyncio.to_thread(skill_digest, skill.path)
    except FileNotFoundError:
        raise SkillNotFound(f"the folder of skill {skill.name!r} ({skill.path}) is gone; refresh the library") from None
    except OSError as exc:
        raise InputError(f"cannot read the folder of skill {skill.name!r} ({skill.path}): {exc}") from exc


def _by_name(skill: Skill) -> str:
    return skill.name


async def _staged_copy_present(fs: WorkspaceFS, ws: Workspace, dest: str) -> bool:
    try:
        await fs.read_file(ws, f"{dest}/{SKILL_FILE}", max_bytes=0)
    except (FileNotFoundError, NotADirectoryError, PathDenied):
        return False
    return True


def _check_host_root(fs: WorkspaceFS, skill: Skill) -> None:
    try:
        HostRoots(fs.host_roots).check(skill.path)
    except PathDenied as exc:
        raise PathDenied(
            str(skill.path),
            f"{exc.reason}. Skills are copied from the host: open the engine with "
            "host_roots including the skill roots (e.g. host_roots=library.roots)",
        ) from exc


async def _remove_tree(fs: WorkspaceFS, ws: Workspace, dest: str) -> None:
    # the whole old copy goes: copying over it would keep files the new version deleted
    with contextlib.suppress(FileNotFoundError):
        await fs.remove(ws, dest)


async def _require_script(fs: WorkspaceFS, ws: Workspace, name: str, rel: str) -> None:
    try:
        await fs.read_file(ws, f"{_SKILLS_DIR}/{name}/{rel}", max_bytes=0)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise SkillNotFound(f"skill {name!r} has no file {rel!r}") from None
    except PathDenied as exc:
        raise SkillNotFound(f"skill {name!r}: {rel!r} is not a regular file ({exc.reason})") from None


def _language_of(rel: str) -> Language | None:
    suffix = posixpath.splitext(rel)[1].lower()
    return next((lang for lang in LANGUAGES if suffix and lang.extension == suffix), None)


def _interpreter(engine: Engine, ws: Workspace, rel: str) -> tuple[str, ...]:
    """The command prefix that runs ``rel``: its language's runtime, or nothing (run it directly)."""
    lang = _language_of(rel)
    if lang is None:
        return ()
    caps = engine.describe()
    if lang.name not in caps.languages:
        raise UnsupportedLanguage(
            f"no runtime for {lang.name} scripts on backend {caps.backend!r} "
            f"(has: {', '.join(caps.languages) or 'none'})"
        )
    # only host-path workspaces share this host's PATH (as in the code executor)
    found = pick_runtime(lang, None) if ws.host_path is not None else None
    return found or lang.runtimes[0]


# -- model tools ----------------------------------------------------------------------


class SkillListTool:
    """``skill_list``: the skills the model may run, or one skill's instructions."""

    def __init__(self, library: SkillLibrary, *, instructions_budget: int = DEFAULT_SKILL_OUTPUT_BUDGET) -> None:
        self.library = library
        self.instructions_budget = instructions_budget
        self.spec = ToolSpec(
            "skill_list",
            "List the skills available in the workspace (name and description). Give `name` to read "
            "that skill's instructions (its SKILL.md), which say which scripts it has and how to call "
            "them with skill_run. Skills are staged read-only at skills/<name>.",
            {
                "type": "object",
                "properties": {"name": {"type": "string", "description": "A skill name: return its instructions too."}},
                "additionalProperties": False,
            },
        )

    async def call(self, arguments: ToolArguments) -> dict[str, Any]:
        try:
            args = check_arguments(self.spec.parameters, arguments)
            if "name" not in args:
                return {"status": "ok", "skills": self.library.list_for_model()}
            skill = self.library.get(args["name"])
        except ExecspaceError as exc:
            return error_result(exc)
        text, truncated, total = clip_text(skill.instructions, self.instructions_budget)
        return {
            "status": "ok",
            "name": skill.name,
            "description": skill.description,
            "instructions": text,
            "instructions_truncated": truncated,
            "instructions_total_bytes": total,
        }


class SkillRunTool:
    """``skill_run``: run one script of a skill in the bound workspace and report its output and new files.

    stdout and stderr are each kept to ``output_budget`` bytes (head and tail, with a
    marker saying how much was dropped); files created or changed under ``out/`` are listed.
    """

    def __init__(
        self,
        library: SkillLibrary,
        engine: Engine,
        ws: Workspace,
        *,
        output_budget: int = DEFAULT_SKILL_OUTPUT_BUDGET,
        max_timeout: float = SKILL_RUN_TIMEOUT,
        limits: ResourceLimits | None = None,
    ) -> None:
        if output_budget <= 0 or max_timeout <= 0:
            raise InvalidSpec("output_budget and max_timeout must be positive")
        self.library = library
        self.engine = engine
        self.ws = ws
        self.max_timeout = max_timeout
        # the runner keeps exactly the budget (head + tail): no second cut, and the totals stay true
        self.limits = replace(limits or ResourceLimits(), output_bytes=output_budget)

    @property
    def spec(self) -> ToolSpec:
        """The tool's spec; its ``skill`` enum follows the library (also after :meth:`SkillLibrary.refresh`)."""
        names = sorted(self.library.skills)
        skill: dict[str, Any] = {"type": "string", "description": "The skill's name (see skill_list)."}
        if names:
            skill["enum"] = names
        return ToolSpec(
            "skill_run",
            "Run a script of a skill. `script` is a path inside the skill (e.g. scripts/extract.py); "
            ".py/.sh/.js/.ts scripts run with their interpreter, others are executed directly. The "
            "working directory is the workspace's work/ (inputs in work/inputs/); write results to "
            "$OUTPUT_DIR (out/). The skill's bin/ is on PATH. Returns exit_code, stdout, stderr and "
            "the files created or changed under out/.",
            {
                "type": "object",
                "properties": {
                    "skill": skill,
                    "script": {"type": "string", "minLength": 1, "description": "Path of the script in the skill."},
                    "args": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": 256,
                        "description": "Arguments, passed as they are (no shell).",
                    },
                    "stdin": {"type": "string", "description": "Text given on standard input."},
                    "timeout_sec": {
                        "type": "number",
                        "minimum": 1,
                        "maximum": self.max_timeout,
                        "description": f"Deadline in seconds (default {self.max_timeout:g}).",
                    },
                },
                "required": ["skill", "script"],
                "additionalProperties": False,
            },
        )

    async def call(self, arguments: ToolArguments) -> dict[str, Any]:
        try:
            args = check_arguments(self.spec.parameters, arguments)
            io = WorkspaceIO(self.engine, self.ws)
            before = await io.snapshot()
            run = await self.library.run_skill(
                self.engine,
                self.ws,
                args["skill"],
                args["script"],
                args.get("args", []),
                stdin=args.get("stdin"),
                timeout=float(args.get("timeout_sec", self.max_timeout)),
                limits=self.limits,
            )
            changes, changed = await io.changes(before, limit=MAX_FILES_LISTED)
        except ExecspaceError as exc:
            return error_result(exc)
        return _run_report(run, changes, changed)


def _run_report(run: RunResult, changes: Sequence[FileChange], changed: int) -> dict[str, Any]:
    # the same fields as workspace_exec, so a model reads both tools' results alike
    report: dict[str, Any] = {
        "status": "exited",
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "duration_sec": round(run.duration, 3),
        "stdout": run.stdout,
        "stderr": run.stderr,
    }
    if run.limit_hit and not run.timed_out:
        report["limit_hit"] = run.limit_hit
    for name, cut, total in (
        ("stdout", run.stdout_truncated, run.stdout_total_bytes),
        ("stderr", run.stderr_truncated, run.stderr_total_bytes),
    ):
        if cut:
            report[f"{name}_truncated"] = True
            report[f"{name}_total_bytes"] = total
    report["files"] = [c.as_dict() for c in changes]
    if changed > len(changes):
        report["files_not_listed"] = changed - len(changes)
    return report
