"""The one TOML config reader (serve's --config, the MCP server's --config, the user's config file): a table maps
onto a frozen dataclass by its annotations, and every refusal names the file, the key and what it takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from execspace.errors import InvalidSpec
from execspace.tomlconfig import from_table, load


@dataclass(frozen=True, slots=True)
class Limits:
    memory_mb: int | None = None
    cpus: float = 1.0


@dataclass(frozen=True, slots=True)
class Settings:
    name: str = "default"
    verbose: bool = False
    mode: Literal["fast", "safe"] = "safe"
    roots: tuple[Path, ...] = ()
    limits: Limits = field(default_factory=Limits)
    extra: Mapping[str, object] = field(default_factory=dict)
    named: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name == "forbidden":
            raise InvalidSpec("name must not be 'forbidden'")


@dataclass(frozen=True, slots=True)
class Named:
    name: str
    size: int


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load(Settings, path, f"the test config {path}")


def test_a_table_maps_onto_the_dataclass_by_its_annotations(tmp_path: Path) -> None:
    settings = _load(
        tmp_path,
        'name = "x"\nverbose = true\nmode = "fast"\nroots = ["/a", "b"]\nnamed = {one = 1}\n'
        '[limits]\nmemory_mb = 512\ncpus = 2\n[extra]\nmode = "session"\nnested = {deep = [1, 2]}\n',
    )
    assert settings == Settings(
        name="x",
        verbose=True,
        mode="fast",
        roots=(Path("/a"), Path("b")),
        limits=Limits(memory_mb=512, cpus=2),
        extra={"mode": "session", "nested": {"deep": [1, 2]}},
        named={"one": 1},
    )
    assert _load(tmp_path, "") == Settings()  # every key left out takes its default


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nmae = 'x'", "unknown key nmae; the top level takes name, verbose, mode, roots, limits, extra, named"),
        ("[limits]\nmemroy_mb = 1", "unknown key limits.memroy_mb; [limits] takes memory_mb, cpus"),
        ("name = 3", "name must be a string, not an integer"),
        ("verbose = 1", "verbose must be a boolean, not an integer"),
        ("[limits]\nmemory_mb = true", "limits.memory_mb must be an integer, not a boolean"),
        ("[limits]\nmemory_mb = 1.5", "limits.memory_mb must be an integer, not a float"),
        ("[limits]\ncpus = '2'", "limits.cpus must be a number, not a string"),
        ("mode = 'quick'", "mode must be one of 'fast', 'safe', not a string"),
        ("roots = '/a'", "roots must be an array of paths (non-empty strings), not a string"),
        ("roots = ['/a', '']", "roots[1] must be a path (a non-empty string), not a string"),
        ("limits = 3", "limits must be a table, not an integer"),
        ("extra = [1]", "extra must be a table, not an array"),
        ("named = {one = 'x'}", "named.one must be an integer, not a string"),
        ("name = 'forbidden'", "name must not be 'forbidden'"),
    ],
)
def test_a_refusal_names_the_file_the_key_and_what_it_takes(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        _load(tmp_path, text)
    assert str(info.value) == f"the test config {tmp_path / 'c.toml'}: {says}"


def test_a_refused_value_is_not_echoed(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec) as info:
        _load(tmp_path, "verbose = 's3cret-token'")
    assert "s3cret" not in str(info.value)


def test_fixed_fields_come_from_the_caller_and_a_required_key_must_be_there() -> None:
    assert from_table(Named, {"size": 3}, "the test config", at="items.a", fixed={"name": "a"}) == Named("a", 3)
    with pytest.raises(InvalidSpec, match=r"unknown key items\.a\.name; \[items\.a\] takes size$"):
        from_table(Named, {"name": "b", "size": 3}, "the test config", at="items.a", fixed={"name": "a"})
    with pytest.raises(InvalidSpec, match=r"^the test config: \[items\.a\] needs the key size \(an integer\)$"):
        from_table(Named, {}, "the test config", at="items.a", fixed={"name": "a"})


def test_a_file_that_is_missing_unreadable_or_not_toml_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    with pytest.raises(InvalidSpec, match=rf"cannot read the test config {missing}: there is no such file"):
        load(Settings, missing, f"the test config {missing}")
    assert load(Settings, missing, "the test config", missing_ok=True) == Settings()
    with pytest.raises(InvalidSpec, match=rf"cannot read the test config {tmp_path}: Is a directory"):
        load(Settings, tmp_path, f"the test config {tmp_path}")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = 'x'\nverbose = yes\n")
    with pytest.raises(InvalidSpec, match=r"is not valid TOML: Invalid value \(at line 2, column 11\); fix it$"):
        load(Settings, broken, f"the test config {broken}")
    broken.write_bytes(b"name = '\xff'\n")
    with pytest.raises(InvalidSpec, match="is not valid TOML"):
        load(Settings, broken, f"the test config {broken}")
