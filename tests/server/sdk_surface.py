"""The SDK version matrix's run at the edges of the surface (a script for another interpreter with another e2b
installed: no pytest, no execspace there): a killed command, a removed path that was not there, a directory's and
a link's entry info, file metadata, a watch's events, and a sandbox killed under a running command; with
EXECSPACE_MACHINE=1 (a root server's sandboxes are machines), the machine: ``user`` with its home and ``sudo``, and
the file API over ``/tmp`` and ``/etc``. The server and key come from E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY;
it prints "ok", or fails at the first check that does not hold."""

from __future__ import annotations

import os
import sys
import time

from e2b import CommandExitException, FileType, Sandbox, SandboxException, TimeoutException


def machine(sbx: Sandbox) -> None:
    """The machine E2B's code expects: who runs, where, as root by sudo, and the file API beyond the home."""
    ran = sbx.commands.run("whoami; echo $HOME; pwd; sudo -n whoami")
    assert ran.stdout.split() == ["user", "/home/user", "/home/user", "root"], ran
    sbx.files.write("/tmp/m.txt", "t", metadata={"k": "tmp"})
    assert sbx.commands.run("cat /tmp/m.txt").stdout == "t"
    info = sbx.files.get_info("/tmp/m.txt")
    assert (info.path, info.size, info.metadata) == ("/tmp/m.txt", 1, {"k": "tmp"}), info
    assert "m.txt" in [e.name for e in sbx.files.list("/tmp")]
    sbx.commands.run("sudo sh -c 'echo e > /etc/m-file'")
    assert sbx.files.read("/etc/m-file") == "e\n"
    try:
        sbx.files.write("/etc/by-api", "no")
        raise AssertionError("the user wrote /etc through the file API")
    except SandboxException as exc:
        assert "Permission denied" in str(exc), exc
    sbx.files.rename("/tmp/m.txt", "/home/user/from-tmp.txt")
    assert sbx.files.read("from-tmp.txt") == "t"


def main() -> int:
    sbx = Sandbox.create()
    try:
        if os.environ.get("EXECSPACE_MACHINE") == "1":
            machine(sbx)
        command = sbx.commands.run("sleep 60", background=True)
        assert command.kill()
        try:
            command.wait()
            raise AssertionError("a killed command's wait raised nothing")
        except CommandExitException as exc:
            assert exc.exit_code == -1, exc.exit_code
        sbx.files.remove("never-there.txt")  # as envd: nothing to remove is no error
        sbx.files.make_dir("d")
        directory = sbx.files.get_info("d")
        assert directory.type == FileType.DIR and directory.size > 0, directory
        sbx.files.write("d/f.txt", "x")
        sbx.commands.run("ln -s f.txt link", cwd="/home/user/d")
        link = sbx.files.get_info("d/link")
        # these lines read no is_symlink: a link is what it points to, as envd describes it
        assert (link.type, link.symlink_target) == (FileType.FILE, "/home/user/d/f.txt"), link
        assert sbx.files.write("d/m.txt", "m", metadata={"k": "v"}).metadata == {"k": "v"}
        assert sbx.files.rename("d/m.txt", "d/n.txt").metadata == {"k": "v"}
        assert [e.metadata for e in sbx.files.list("d") if e.name == "n.txt"] == [{"k": "v"}]
        watch = sbx.files.watch_dir("d", recursive=True, include_entry=True, allow_network_mounts=True)
        sbx.files.write("d/e/w.txt", "w")
        events = watch.get_new_events()
        watch.stop()
        kinds = [(e.name, e.type.name) for e in events if e.name == "e/w.txt"]
        assert kinds == [("e/w.txt", "CREATE"), ("e/w.txt", "CHMOD"), ("e/w.txt", "WRITE")], events
        assert all(
            e.entry is not None and e.entry.path == "/home/user/d/e/w.txt" for e in events if e.name == "e/w.txt"
        )
    finally:
        sbx.kill()
    doomed = Sandbox.create()
    running = doomed.commands.run("sleep 60", background=True)
    doomed.kill()
    began = time.monotonic()
    try:
        running.wait()
        raise AssertionError("a command of a killed sandbox raised nothing")
    except TimeoutException as exc:
        assert "sandbox was killed or reached its end of life" in str(exc), exc
    assert time.monotonic() - began < 5
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
