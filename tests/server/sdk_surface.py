"""The SDK version matrix's run at the edges of the surface (a script for another interpreter with another e2b
installed: no pytest, no execspace there): a killed command, a removed path that was not there, a directory's and
a link's entry info, file metadata, a watch's events, and a sandbox killed under a running command. The server and
key come from E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY; it prints "ok", or fails at the first check that does
not hold."""

from __future__ import annotations

import sys
import time

from e2b import CommandExitException, FileType, Sandbox, TimeoutException


def main() -> int:
    sbx = Sandbox.create()
    try:
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
