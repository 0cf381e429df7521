"""A serve sandbox is the machine E2B's code expects (as root: the sandbox backend's machine mode): ``user`` with a
passwd entry and ``HOME=/home/user`` everywhere, passwordless ``sudo``, ``pip install`` without sudo that the kernel
imports, and the file API over the program's whole view (``/tmp``, ``/etc``, ``/opt``) with its permissions.
The host, the environment store and other sandboxes see none of it (attacked in
tests/redteam/test_round3_wholeview.py)."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import e2b_code_interpreter as ci
import pytest
from e2b.exceptions import SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException

from .conftest import code_interpreter_environment

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="machine mode maps two host uids: serve gives it as root")


def wheel(name: str) -> bytes:
    """A pure-Python wheel of the package ``name`` (``name.X`` says it was installed)."""
    buf = io.BytesIO()
    info = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{name}/__init__.py", "X = 'installed at run time'\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return buf.getvalue()


def tree_digest(top: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            st = os.lstat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}:{st.st_mode}:{st.st_uid}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def sh(sbx: ci.Sandbox, cmd: str) -> tuple[int, str, str]:
    try:
        r = sbx.commands.run(cmd, timeout=60)
        return r.exit_code, r.stdout, r.stderr
    except CommandExitException as e:
        return e.exit_code, e.stdout, e.stderr


@pytest.fixture
def machine() -> Iterator[ci.Sandbox]:
    sandbox = ci.Sandbox.create(timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_the_program_is_user_with_a_passwd_entry_a_home_sudo_and_a_git_identity(machine: ci.Sandbox) -> None:
    code, out, err = sh(
        machine,
        "whoami; echo $HOME; pwd; python3 -c 'import os,pwd; print(pwd.getpwuid(os.getuid()).pw_name)'; sudo -n whoami;"
        "ls -ld ~ | awk '{print $3}'; cd ~ && git init -q r && cd r && touch a && git add a && git commit -qm m &&"
        " git log --format=%an",
    )
    assert code == 0, err
    assert out.split() == ["user", "/home/user", "/home/user", "user", "root", "user", "user"]
    # ~ in a shell is the file API's /home/user, and the kernel has the same user and home
    sh(machine, "echo hi > ~/a.txt")
    assert machine.files.read("/home/user/a.txt") == "hi\n"
    ex = machine.run_code("import os, pwd; print(os.environ['HOME'], os.getcwd(), pwd.getpwuid(os.getuid()).pw_name)")
    assert "".join(ex.logs.stdout).split() == ["/home/user", "/home/user", "user"], ex.error


def test_a_command_runs_as_root_when_the_sdk_names_it(machine: ci.Sandbox) -> None:
    """``commands.run(..., user="root")`` (the SDK's own MCP gateway asks for it) runs as the sandbox's root, with
    its name and home; another user is refused naming the sandbox's; files stay ``user``'s."""
    done = machine.commands.run("id -un; echo $HOME $USER; touch /etc/by-root && stat -c %U /etc/by-root", user="root")
    assert done.stdout == "root\n/root root\nroot\n"
    assert machine.commands.run("id -un", user="user").stdout == "user\n"
    with pytest.raises(SandboxException, match="its users are"):
        machine.commands.run("true", user="nobody")
    with pytest.raises(SandboxException, match="the only user is 'user'"):
        machine.files.write("/home/user/x.txt", "x", user="root")


def test_pip_installs_without_sudo_and_the_kernel_imports_it_the_store_untouched(machine: ci.Sandbox) -> None:
    store = code_interpreter_environment().path
    before = tree_digest(store)
    machine.files.write("/tmp/cmdpkg-0.1-py3-none-any.whl", wheel("cmdpkg"))
    machine.files.write("/tmp/cellpkg-0.1-py3-none-any.whl", wheel("cellpkg"))
    code, out, err = sh(machine, "pip install -q --no-index /tmp/cmdpkg-0.1-py3-none-any.whl")
    assert code == 0, (out, err)
    ex = machine.run_code("import cmdpkg; print(cmdpkg.X)")
    assert ex.error is None and "".join(ex.logs.stdout) == "installed at run time\n"
    cell = "!pip install -q --no-index /tmp/cellpkg-0.1-py3-none-any.whl\nimport cellpkg; print(cellpkg.X)"
    ex = machine.run_code(cell)
    assert ex.error is None and "installed at run time" in "".join(ex.logs.stdout), ex.logs
    assert tree_digest(store) == before
    # another sandbox has neither
    other = ci.Sandbox.create(timeout=60)
    try:
        ex = other.run_code("import cmdpkg")
        assert ex.error is not None and ex.error.name == "ModuleNotFoundError"
    finally:
        other.kill()


def test_the_file_api_is_the_programs_whole_view_with_its_permissions(machine: ci.Sandbox) -> None:
    machine.files.write("/tmp/x.txt", "via files")
    assert sh(machine, "cat /tmp/x.txt; stat -c %U /tmp/x.txt") == (0, "via filesuser\n", "")
    sh(machine, "echo from-program > /tmp/y.txt")
    assert machine.files.read("/tmp/y.txt") == "from-program\n"
    # root's files: readable where the user may read them, never writable by the user
    assert sh(machine, "sudo sh -c 'echo pub > /etc/pub-file; mkdir -p /opt/tool; echo t > /opt/tool/t'")[0] == 0
    assert machine.files.read("/etc/pub-file") == "pub\n"
    assert [e.name for e in machine.files.list("/opt/tool")] == ["t"]
    with pytest.raises(SandboxException, match="Permission denied"):
        machine.files.write("/etc/by-api", "no")
    assert sh(machine, "test -e /etc/by-api")[0] == 1
    assert not os.path.exists("/etc/by-api") and not os.path.exists("/etc/pub-file")
    names = {e.name for e in machine.files.list("/")}
    assert {"etc", "tmp", "usr", "home"} <= names
    # a big file both ways, in pieces
    blob = os.urandom(2_500_000)
    machine.files.write("/tmp/blob", blob)
    assert machine.files.read("/tmp/blob", format="bytes") == blob
    assert sh(machine, "sha256sum < /tmp/blob")[1].split()[0] == hashlib.sha256(blob).hexdigest()
    machine.files.make_dir("/tmp/d")
    machine.files.rename("/tmp/x.txt", "/tmp/d/x.txt")
    assert machine.files.exists("/tmp/d/x.txt") and not machine.files.exists("/tmp/x.txt")
    machine.files.remove("/tmp/d")
    assert sh(machine, "test -e /tmp/d")[0] == 1
    # contexts outside the home
    context = machine.create_code_context(cwd="/tmp")
    ex = machine.run_code("import os; print(os.getcwd())", context=context)
    assert "".join(ex.logs.stdout) == "/tmp\n", ex.error


@pytest.fixture
async def amachine() -> AsyncIterator[ci.AsyncSandbox]:
    sandbox = await ci.AsyncSandbox.create(timeout=120)
    try:
        yield sandbox
    finally:
        await sandbox.kill()


async def test_the_async_sdk_reaches_tmp_and_etc_too(amachine: ci.AsyncSandbox) -> None:
    await amachine.files.write("/tmp/a.txt", "async")
    r = await amachine.commands.run("cat /tmp/a.txt; sudo sh -c 'echo e > /etc/async-file'", timeout=30)
    assert r.stdout == "async"
    assert await amachine.files.read("/etc/async-file") == "e\n"
    info = await amachine.files.get_info("/tmp/a.txt")
    assert (info.path, info.size) == ("/tmp/a.txt", 5)


def test_metadata_outside_the_home_is_the_files_own_xattrs(machine: ci.Sandbox) -> None:
    # set by the agent in the sandbox: the program sees the attributes, and stat and list read them back
    written = machine.files.write("/tmp/tagged.txt", "m", metadata={"Owner": "ana", "k": "v"})
    assert written.metadata == {"owner": "ana", "k": "v"}
    code, out, err = sh(
        machine,
        "python3 -c \"import os; print(sorted((a, os.getxattr('/tmp/tagged.txt', a).decode())"
        " for a in os.listxattr('/tmp/tagged.txt')))\"",
    )
    assert code == 0, err
    assert out.strip() == "[('user.e2b.k', 'v'), ('user.e2b.owner', 'ana')]"
    assert machine.files.get_info("/tmp/tagged.txt").metadata == {"owner": "ana", "k": "v"}
    listed = {e.name: e.metadata for e in machine.files.list("/tmp")}
    assert listed["tagged.txt"] == {"owner": "ana", "k": "v"}
    # a program's attribute is read back too; a file rewritten without metadata has none
    assert sh(machine, "python3 -c \"import os; os.setxattr('/tmp/tagged.txt', 'user.e2b.by', b'prog')\"")[0] == 0
    assert machine.files.get_info("/tmp/tagged.txt").metadata == {"owner": "ana", "k": "v", "by": "prog"}
    machine.files.write("/tmp/tagged.txt", "again")
    assert not machine.files.get_info("/tmp/tagged.txt").metadata
    # where the user may not write, nothing is written, metadata or not
    with pytest.raises(SandboxException, match="Permission denied"):
        machine.files.write("/etc/tagged", "no", metadata={"k": "v"})
    assert sh(machine, "test -e /etc/tagged")[0] == 1


def test_a_move_between_tmp_and_the_home_crosses_filesystems_as_mv_does(machine: ci.Sandbox) -> None:
    # /tmp is the session's tmpfs, the home another filesystem: the move is a copy, then the source goes
    machine.files.write("/tmp/t.txt", "t", metadata={"k": "v"})
    moved = machine.files.rename("/tmp/t.txt", "/home/user/t.txt")
    assert (moved.path, moved.metadata) == ("/home/user/t.txt", {"k": "v"})
    assert machine.files.read("/home/user/t.txt") == "t" and not machine.files.exists("/tmp/t.txt")
    assert (
        sh(machine, "mkdir -p ~/tree/sub && echo a > ~/tree/sub/a && chmod 640 ~/tree/sub/a && ln -s sub/a ~/tree/l")[0]
        == 0
    )
    machine.files.rename("/home/user/tree", "/tmp/tree")
    code, out, err = sh(
        machine, "stat -c '%n %a %F' /tmp/tree/sub/a; readlink /tmp/tree/l; cat /tmp/tree/l; test -e ~/tree"
    )
    assert (code, out) == (1, "/tmp/tree/sub/a 640 regular file\nsub/a\na\n"), err
    # a directory does not replace one
    machine.files.make_dir("/home/user/tree")
    machine.files.write("/home/user/tree/keep", "k")
    with pytest.raises(SandboxException):
        machine.files.rename("/tmp/tree", "/home/user/tree")
    assert machine.files.read("/home/user/tree/keep") == "k" and machine.files.exists("/tmp/tree/sub/a")
