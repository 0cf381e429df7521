"""The SDK version matrix's smoke run: a script for another interpreter with another e2b installed (no pytest, no
execspace there). The server and key come from E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY; it prints one line
per check and exits non-zero at the first that fails."""

from __future__ import annotations

import sys

from e2b import CommandExitException, Sandbox, SandboxException


def main() -> int:
    sbx = Sandbox.create(metadata={"matrix": "1"}, envs={"X": "from-sandbox"})
    try:
        assert sbx.get_info().metadata == {"matrix": "1"}
        assert sbx.commands.run("echo $X").stdout == "from-sandbox\n"
        try:
            sbx.commands.run("exit 4")
            raise AssertionError("exit 4 raised nothing")
        except CommandExitException as exc:
            assert exc.exit_code == 4
        handle = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(handle.pid, "in\n")
        sbx.commands.close_stdin(handle.pid)
        assert handle.wait().stdout == "in\n"
        sbx.files.write("a/b.bin", bytes(range(256)))
        assert sbx.files.read("a/b.bin", format="bytes") == bytes(range(256))
        assert [e.name for e in sbx.files.list("a")] == ["b.bin"]
        assert sbx.files.exists("a/b.bin") and not sbx.files.exists("nope")
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        # before 2.51 the SDK sends allow_internet_access=True on every create: a server without
        # --allow-internet-access creates that sandbox offline and says so, and refuses an allow-list
        assert sbx.get_info().allow_internet_access is False
        try:
            Sandbox.create(network={"allow_out": ["example.com"], "deny_out": ["0.0.0.0/0"]})
            raise AssertionError("an allow-list on a server without the network was created")
        except SandboxException as exc:
            assert str(exc).startswith("403: ") and "--allow-internet-access" in str(exc), exc
    finally:
        assert sbx.kill()
    assert not sbx.is_running()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
