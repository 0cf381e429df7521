"""Round 3, ``execspace serve``'s file API against a tenant that attacks the server process (issue 28: 2 and 5).

2: bodies are never held whole. An upload is written a chunk at a time to a new file beside its target as it
arrives, refused with 413 as soon as it passes the cap (the server reads no further and closes the connection), and
it replaces the target only once complete: a half-done one leaves nothing visible. A download streams from the
opened file, so a sparse terabyte costs the server a chunk of memory; a FIFO, socket or device is refused at once,
naming what it is. 5: an upload admitted by a signed URL writes the signed path and nothing else.

Every case runs against a real ``execspace serve`` subprocess and observes the host: the server's RSS and peak
(``/proc/<pid>/status``, the peak reset through ``clear_refs`` first), its descriptors, the bytes the client got
to send, and the workspace's directory on the host.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import stat
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("httpx", reason="needs the agent extra (pip install 'execspace[agent]')")
pytest.importorskip("e2b", reason="the server is attacked through the official e2b SDK (pip install 'execspace[dev]')")

import httpx
from e2b import Sandbox

from tests.server.conftest import Server, in_homes, running_server
from tests.support import until

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
CAP_MB = 128
#: Growth of the server's peak RSS one transfer may cause: a few chunks in flight, never the file.
RSS_BOUND = 48 * MiB
#: Bytes a client gets to send past the cap before the server's refusal stops it: what the two sockets buffer.
SOCKET_SLACK = 64 * MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve"), "--max-upload-mb", str(CAP_MB)) as found:
        yield found


@pytest.fixture(scope="module")
def sbx(server: Server) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(api_key=server.key, api_url=server.url, sandbox_url=server.url, timeout=600)
    try:
        yield sandbox
    finally:
        sandbox.kill()


@pytest.fixture(scope="module")
def work(server: Server, sbx: Sandbox) -> Path:
    """The sandbox's home (``/home/user``) on the host."""
    sbx.files.write("marker.txt", "here")
    found = [p.parent for p in in_homes(server.root, "marker.txt")]
    assert len(found) == 1, found
    return found[0]


def _headers(sbx: Sandbox, **more: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or "", **more}


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{field}:"))


@contextlib.contextmanager
def _memory_growth(server: Server) -> Iterator[list[int]]:
    """Yields a list that holds, once the block ends, how far the server's peak RSS rose above its RSS at the start
    (the peak is reset to the current RSS first, so earlier work does not count)."""
    pid = server.process.pid
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    start = _status(pid, "VmRSS")
    growth: list[int] = []
    yield growth
    growth.append(_status(pid, "VmHWM") - start)


def _fds(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def _temps(directory: Path, name: str) -> list[str]:
    """The new files an upload of ``name`` writes beside it before it replaces it."""
    return [n for n in os.listdir(directory) if n.startswith(f".{name[:40]}.") and n.endswith(".tmp")]


@pytest.fixture(autouse=True)
def _warm(server: Server, sbx: Sandbox) -> None:
    """A round trip first, so that what the server imports or caches on first use is not counted as growth."""
    sbx.files.write("warm.bin", os.urandom(MiB))
    assert len(sbx.files.read("warm.bin", format="bytes")) == MiB


class _Counted:
    """A request body of ``total`` bytes made as the client sends it, counting what the server let it send."""

    def __init__(self, total: int) -> None:
        self.total, self.sent = total, 0
        self._block = os.urandom(MiB)

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < self.total:
            self.sent += len(self._block)
            yield self._block


@pytest.mark.parametrize("kind", ["octet-stream", "multipart", "gzip"])
def test_an_upload_over_the_cap_is_refused_as_it_arrives(server: Server, sbx: Sandbox, work: Path, kind: str) -> None:
    """1 GiB offered without a length against a 128 MiB cap: 413 once the cap is passed, the client sent no more
    than the sockets buffer, no file and no temp left, the server's memory flat."""
    body = _Counted(1024 * MiB)
    name = f"over-{kind}.bin"
    with _memory_growth(server) as growth:
        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            if kind == "multipart":
                answer = http.post("/files", files={"file": (name, _Reader(body))}, headers=_headers(sbx))
            else:
                content: Iterator[bytes] = _gzipped(body) if kind == "gzip" else iter(body)
                more = {"Content-Type": "application/octet-stream"}
                if kind == "gzip":
                    more["Content-Encoding"] = "gzip"
                answer = http.post("/files", params={"path": name}, content=content, headers=_headers(sbx, **more))
        elapsed = time.monotonic() - started
    assert answer.status_code == 413, answer.text
    assert "larger than this server takes" in answer.json()["message"]
    # random blocks barely compress: a gzip body's decoded size is about what was sent
    assert body.sent < CAP_MB * MiB + SOCKET_SLACK, f"the client sent {body.sent // MiB} MiB before the refusal"
    assert answer.headers.get("connection") == "close"  # the rest of the body is never read
    assert growth[0] < RSS_BOUND, f"the server grew by {growth[0] // MiB} MiB"
    assert not (work / name).exists() and _temps(work, name) == []
    assert elapsed < 60


def test_an_upload_with_a_length_over_the_cap_is_refused_before_its_body(server: Server, sbx: Sandbox) -> None:
    """A declared length over the cap is refused from the head alone: the client sends no byte of a 10 GiB body."""
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    assert host is not None and port is not None
    head = (
        f"POST /files?path=declared.bin HTTP/1.1\r\nHost: {host}\r\nE2b-Sandbox-Id: {sbx.sandbox_id}\r\n"
        f"X-Access-Token: {sbx._envd_access_token}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {10 * 1024 * MiB}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(head.encode())
        answer = _read_response(conn)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"connection: close" in answer.lower()


@pytest.mark.parametrize("kind", ["octet-stream", "multipart"])
def test_an_upload_under_the_cap_is_never_held_in_memory(
    server: Server, sbx: Sandbox, work: Path, tmp_path: Path, kind: str
) -> None:
    """120 MiB through, under the 128 MiB cap: written whole, while the server's peak RSS rises by a few chunks."""
    size = 120 * MiB
    source = tmp_path / "upload.bin"
    with open(source, "wb") as f:
        f.truncate(size)  # sparse: costs the test no disk
        f.seek(size // 2)
        f.write(b"middle")
    name = f"under-{kind}.bin"
    with _memory_growth(server) as growth, open(source, "rb") as f, httpx.Client(timeout=120) as http:
        if kind == "multipart":
            answer = http.post(f"{server.url}/files", files={"file": (name, f)}, headers=_headers(sbx))
        else:
            more = {"Content-Type": "application/octet-stream"}
            answer = http.post(f"{server.url}/files", params={"path": name}, content=f, headers=_headers(sbx, **more))
    assert answer.status_code == 200, answer.text
    assert growth[0] < RSS_BOUND, f"the server grew by {growth[0] // MiB} MiB for a {size // MiB} MiB upload"
    written = work / name
    assert written.stat().st_size == size
    with open(written, "rb") as f:
        f.seek(size // 2)
        assert f.read(6) == b"middle"


def test_a_sparse_terabyte_streams_in_bounded_memory(server: Server, sbx: Sandbox) -> None:
    """A 1 TiB sparse file made in the sandbox, 256 MiB of it downloaded: the length announced, zeros streamed,
    the server's memory flat, and its descriptors back to where they were once the client hangs up."""
    made = sbx.commands.run("truncate -s 1T sparse.bin")
    assert made.exit_code == 0, made.stderr
    fds = _fds(server)
    with _memory_growth(server) as growth:
        got = 0
        with httpx.stream(
            "GET", f"{server.url}/files", params={"path": "sparse.bin"}, headers=_headers(sbx), timeout=60
        ) as answer:
            assert answer.status_code == 200
            assert int(answer.headers["content-length"]) == 1 << 40
            for chunk in answer.iter_raw(MiB):
                assert chunk.count(0) == len(chunk)
                got += len(chunk)
                if got >= 256 * MiB:
                    break
    assert got >= 256 * MiB
    assert growth[0] < RSS_BOUND, f"the server grew by {growth[0] // MiB} MiB"
    until("the server closed the abandoned download's file", lambda: _fds(server) <= fds)
    assert sbx.files.read("marker.txt") == "here"  # and it serves on


def _special_files(work: Path) -> Iterator[tuple[str, str]]:
    """Make the host-made special files in ``work``; (name, what the refusal calls it)."""
    directory = os.open(work, os.O_PATH | os.O_DIRECTORY)
    try:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(f"/proc/self/fd/{directory}/sock")  # a short path to bind, however deep the workspace
        listener.close()
    finally:
        os.close(directory)
    yield "sock", "a socket"
    if os.geteuid() == 0:
        os.mknod(work / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
        yield "zero", "a character device"


def test_special_files_are_refused_at_once_naming_what_they_are(server: Server, sbx: Sandbox, work: Path) -> None:
    """A FIFO the sandbox made (no writer: a blocking open would hang), a socket and, as root, a device with
    /dev/zero's numbers (read, it never ends): each answered 400 at once, naming its type, the server flat."""
    made = sbx.commands.run("mkfifo pipe")
    assert made.exit_code == 0, made.stderr
    cases = [("pipe", "a FIFO"), *_special_files(work)]
    fds = _fds(server)
    with _memory_growth(server) as growth, httpx.Client(base_url=server.url, timeout=10) as http:
        for name, kind in cases:
            started = time.monotonic()
            answer = http.get("/files", params={"path": name}, headers=_headers(sbx))
            assert time.monotonic() - started < 5
            assert answer.status_code == 400, (name, answer.text)
            message = answer.json()["message"]
            assert kind in message and f"/home/user/{name}" in message, message
    assert growth[0] < RSS_BOUND
    until("the server closed every special file", lambda: _fds(server) <= fds)


def test_a_signed_upload_writes_its_path_and_nothing_else(sbx: Sandbox, work: Path) -> None:
    """A URL signed for ``signed/ok.txt``: two parts, a part naming another path (relative, climbing, absolute),
    or a form field beside the file are refused with 403 and write nothing; the file alone is written."""
    url = sbx.upload_url("signed/ok.txt")
    attacks = {
        "two parts": {"files": [("file", ("ok.txt", b"one")), ("file", ("other.txt", b"two"))]},
        "another name": {"files": {"file": ("other.txt", b"x")}},
        "a climbing name": {"files": {"file": ("../../etc/cron.d/x", b"x")}},
        "an absolute name": {"files": {"file": ("/home/user/other.txt", b"x")}},
        "a field beside": {"files": {"file": ("ok.txt", b"x")}, "data": {"path": "other.txt"}},
    }
    with httpx.Client(timeout=30) as http:
        for what, request in attacks.items():
            answer = http.post(url, **request)
            assert answer.status_code == 403, (what, answer.text)
            assert "signed" in answer.json()["message"], (what, answer.text)
            assert not (work / "signed").exists() or os.listdir(work / "signed") == [], what
            assert not (work / "other.txt").exists(), what
        for filename in ("ok.txt", "signed/ok.txt", "/home/user/signed/ok.txt"):
            answer = http.post(url, files={"file": (filename, filename.encode())})
            assert answer.status_code == 200, (filename, answer.text)
            assert (work / "signed" / "ok.txt").read_bytes() == filename.encode()
    assert sorted(os.listdir(work / "signed")) == ["ok.txt"]


def test_a_half_done_upload_leaves_nothing_visible(server: Server, sbx: Sandbox, work: Path) -> None:
    """An upload that stops midway (the client hangs up, a multipart body without its closing boundary, a gzip
    stream cut short or followed by more) never changes its target: while its bytes arrive they go to a new file
    beside it, which is removed when it fails."""
    target = work / "kept.txt"
    target.write_bytes(b"before")
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    assert host is not None and port is not None
    head = (
        f"POST /files?path=kept.txt HTTP/1.1\r\nHost: {host}\r\nE2b-Sandbox-Id: {sbx.sandbox_id}\r\n"
        f"X-Access-Token: {sbx._envd_access_token}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {64 * MiB}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(head.encode() + b"x" * (8 * MiB))
        until("the upload's bytes reached a file beside the target", lambda: _temp_size(work, "kept.txt") >= MiB)
        assert target.read_bytes() == b"before"
    until("the hung-up upload's file removed", lambda: _temps(work, "kept.txt") == [])
    assert target.read_bytes() == b"before"

    boundary = "b0undary"
    unclosed = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="kept.txt"\r\n\r\nafter'
    cut = gzip.compress(os.urandom(MiB))[:-64]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.post(
            "/files",
            content=unclosed.encode(),
            headers=_headers(sbx, **{"Content-Type": f"multipart/form-data; boundary={boundary}"}),
        )
        assert answer.status_code == 400 and "closing boundary" in answer.json()["message"], answer.text
        more = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
        for body in (cut, gzip.compress(b"after") + os.urandom(MiB)):  # cut short; going on past its end
            answer = http.post("/files", params={"path": "kept.txt"}, content=body, headers=_headers(sbx, **more))
            assert answer.status_code == 400 and "gzip" in answer.json()["message"], answer.text
    assert target.read_bytes() == b"before" and _temps(work, "kept.txt") == []


def _temp_size(directory: Path, name: str) -> int:
    sizes = [(directory / n).stat().st_size for n in _temps(directory, name)]
    return max(sizes, default=0)


def _read_response(conn: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 64 KiB)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while len(data) < 65536 and (chunk := conn.recv(65536)):
            data += chunk
    return data


def _gzipped(body: _Counted) -> Iterator[bytes]:
    compress = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for block in body:
        yield compress.compress(block)
    yield compress.flush()


class _Reader:
    """A binary file object over a counted body: httpx streams it as a multipart part without a length."""

    def __init__(self, body: _Counted) -> None:
        self._blocks = iter(body)

    def read(self, size: int = -1) -> bytes:
        return next(self._blocks, b"")


#: Swaps ``d`` for a symlink to a host directory and back until ``stop`` appears (60 s at most); an upload may make
#: ``d`` anew in between (uploads make their parents), which the swapper then throws away.
SWAPPER = """
import os, shutil, time
end = time.monotonic() + 60
while time.monotonic() < end and not os.path.exists("stop"):
    for step in (lambda: os.rename("d", "d.real"), lambda: os.symlink("{outside}", "d"), lambda: os.unlink("d")):
        try:
            step()
        except OSError:
            pass
    if os.path.isdir("d") and not os.path.islink("d"):
        shutil.rmtree("d", ignore_errors=True)
    try:
        os.rename("d.real", "d")
    except OSError:
        pass
"""


def test_uploads_racing_a_directory_swapped_for_a_link_never_write_outside(
    server: Server, sbx: Sandbox, work: Path, tmp_path: Path
) -> None:
    """A program swaps the upload's directory for a symlink to a host directory and back, as fast as it can, while
    300 uploads go there: every one lands inside the workspace or is refused; the host directory is untouched, and
    no temporary file is left anywhere."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)  # writable by anyone: only the server's confinement stands between it and the uploads
    sbx.files.make_dir("/home/user/d")
    sbx.files.write("/home/user/swap.py", SWAPPER.format(outside=str(outside)))
    handle = sbx.commands.run("cd /home/user && python3 swap.py", background=True)
    landed = refused = 0
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(300):
                answer = client.post(
                    "/files", params={"path": f"/home/user/d/up-{i}.txt"}, content=b"x" * 1000, headers=_headers(sbx)
                )
                if answer.status_code == 200:
                    landed += 1
                else:
                    assert answer.status_code in (400, 404), answer.text
                    refused += 1
    finally:
        sbx.files.write("/home/user/stop", "")
        handle.wait()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep"
    assert not [p for p in work.rglob("*.tmp") if p.name.startswith(".")], "a temporary upload was left behind"
    assert landed + refused == 300 and refused < 300
    # the refusals are the race's: the same uploads without the swapper all land
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(20):
            answer = client.post(
                "/files", params={"path": f"/home/user/d/calm-{i}.txt"}, content=b"x", headers=_headers(sbx)
            )
            assert answer.status_code == 200, answer.text
