"""Model validation, RunResult.check, and the head+tail output buffer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execspace import (
    ExecutionTimeout,
    InputSpec,
    InvalidSpec,
    OutputSpec,
    ProgramFailed,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    UsageError,
    WorkspacePolicy,
)
from execspace.process.capture import HeadTailBuffer

# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: RunProgramSpec(""),
        lambda: RunProgramSpec("python3", timeout=-1),
        lambda: RunProgramSpec("python3", timeout=0),
        lambda: RunProgramSpec("echo", "hello world"),
        lambda: RunProgramSpec("env", env={"": "x"}),
        lambda: RunProgramSpec("env", env={"A=B": "x"}),
        lambda: RunProgramSpec("env", env={"NUL\0": "x"}),
        lambda: RunProgramSpec("env", env={"A": "x\0y"}),
        lambda: RunProgramSpec("env", env={"A": 1}),  # type: ignore[dict-item]
        lambda: RunProgramSpec("echo", ["a\0b"]),
        lambda: RunProgramSpec("echo", [1]),  # type: ignore[list-item]
        lambda: RunProgramSpec("ec\0ho"),
        lambda: ResourceLimits(memory_bytes=-1),
        lambda: ResourceLimits(cpu_seconds=0),
        lambda: ResourceLimits(output_bytes=0),
        lambda: ResourceLimits(pids=-5),
        lambda: OutputSpec(max_files=0),
        lambda: OutputSpec(max_file_bytes=-1),
        lambda: WorkspacePolicy(max_disk_bytes=0),
        lambda: InputSpec(b"raw bytes"),
        lambda: InputSpec("artifact://x", mode="move"),  # type: ignore[arg-type]
    ],
    ids=lambda _: "",
)
def test_invalid_values_raise_invalid_spec(make: object) -> None:
    with pytest.raises(InvalidSpec) as info:
        make()  # type: ignore[operator]
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)
    assert str(info.value)


def test_valid_specs_and_none_means_no_limit() -> None:
    spec = RunProgramSpec("python3", ["-c", "pass"], env={"A_1": "x"}, timeout=None)
    assert spec.timeout is None and spec.cwd == "work"
    limits = ResourceLimits(memory_bytes=None, output_bytes=None)
    assert limits.requested() == frozenset()
    assert ResourceLimits().requested() == {"output_bytes"}
    assert ResourceLimits(cpu_seconds=0.5, pids=3).requested() == {"cpu_seconds", "pids", "output_bytes"}


def test_models_are_frozen() -> None:
    spec = RunProgramSpec("x")
    with pytest.raises(AttributeError):
        spec.cmd = "y"  # type: ignore[misc]


# -- RunResult.check ----------------------------------------------------------------------------


def test_check_passes_success_through() -> None:
    ok = RunResult(0, "out", "", 0.1)
    assert ok.check() is ok and ok.ok and ok.signal is None


def test_check_raises_program_failed_with_the_result() -> None:
    failed = RunResult(2, "", "boom on stderr", 0.1)
    with pytest.raises(ProgramFailed) as info:
        failed.check()
    assert info.value.result is failed
    assert "2" in str(info.value) and "boom on stderr" in str(info.value)


def test_check_raises_timeout_with_the_partial_result() -> None:
    timed_out = RunResult(-9, "partial", "", 5.0, timed_out=True, limit_hit="timeout")
    with pytest.raises(ExecutionTimeout) as info:
        timed_out.check()
    assert info.value.result is timed_out
    assert isinstance(info.value, TimeoutError)
    assert timed_out.signal == 9 and not timed_out.ok


def test_timed_out_with_exit_zero_is_not_ok() -> None:
    r = RunResult(0, "", "", 1.0, timed_out=True)
    assert not r.ok
    with pytest.raises(ExecutionTimeout):
        r.check()


# -- HeadTailBuffer ---------------------------------------------------------------------------


def test_small_output_is_kept_whole() -> None:
    buf = HeadTailBuffer(100)
    buf.write(b"hello ")
    buf.write(b"world")
    assert buf.getvalue() == b"hello world"
    assert not buf.truncated and buf.total == 11


def test_head_and_tail_with_marker() -> None:
    buf = HeadTailBuffer(10)
    for i in range(100):
        buf.write(str(i % 10).encode())
    value = buf.getvalue()
    assert buf.truncated and buf.total == 100
    assert value.startswith(b"01234") and value.endswith(b"56789")
    assert b"90 bytes omitted" in value


def test_multibyte_char_cut_at_head_boundary_is_dropped() -> None:
    buf = HeadTailBuffer(10)  # head keeps 5 bytes: "abcd" + the first byte of "€"
    buf.write("abcd€".encode() + b"x" * 50 + "€€".encode()[-5:])
    value = buf.getvalue()
    value.decode("utf-8")  # strict: no split character survives
    assert value.startswith(b"abcd\n[...")
    assert value.endswith("€".encode())
    assert b"\xe2\n" not in value


def test_four_byte_chars_at_both_ends() -> None:
    emoji = "🚀".encode()  # 4 bytes
    buf = HeadTailBuffer(14)  # head 7 bytes = "ab🚀" + 1 stray byte; tail 7 = 3 stray bytes + "🚀"
    buf.write(b"ab" + emoji * 3 + b"-" * 40 + emoji * 3)
    text = buf.getvalue().decode("utf-8")
    assert text.startswith("ab🚀\n[...")
    assert text.endswith("...]\n🚀")


def test_unlimited_buffer() -> None:
    buf = HeadTailBuffer(None)
    buf.write(b"x" * 10_000)
    assert buf.getvalue() == b"x" * 10_000 and not buf.truncated


@settings(max_examples=300, deadline=None, database=None)
@given(
    text=st.text(min_size=0, max_size=300),
    limit=st.integers(min_value=1, max_value=120),
    cuts=st.lists(st.integers(min_value=0, max_value=1200), max_size=8),
)
def test_head_tail_properties(text: str, limit: int, cuts: list[int]) -> None:
    data = text.encode()
    buf = HeadTailBuffer(limit)
    for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)], strict=True):
        buf.write(data[a:b])
    value = buf.getvalue()
    assert buf.total == len(data)
    assert buf.truncated == (len(data) > limit)
    decoded = value.decode("utf-8")  # never a split character, whatever the chunking
    if not buf.truncated:
        assert value == data
        return
    head, _, rest = decoded.partition("\n[... execspace: ")
    count, _, tail = rest.partition(" bytes omitted ...]\n")
    assert text.startswith(head) and text.endswith(tail)
    assert len(head.encode()) <= limit // 2 and len(tail.encode()) <= limit - limit // 2
    assert int(count) == len(data) - len(head.encode()) - len(tail.encode())
