"""TOML config files read onto frozen dataclasses by their annotations: the one reader of ``execspace serve
--config``, ``execspace mcp --config`` and the user's config file, so that each refuses a wrong file the same way.

A table maps onto a dataclass field by field: a key is a field's name, its value is checked against the field's
annotation (``str``, ``int``, ``float``, ``bool``, ``Path``, ``Literal[...]``, ``tuple[X, ...]`` from an array,
``Mapping[str, X]`` and a nested dataclass from a table, ``X | None`` for a key that may be left out), and a key
left out takes the field's default. Every refusal is an ``InvalidSpec`` naming the file, the key (dotted, as
``templates.small.cpu_count``) and what it takes: the type expected, or the keys its table takes. A value in a
refusal is described by its type only, never echoed: a config file may hold secrets.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeVar, Union

from .errors import InvalidSpec

__all__ = ["from_table", "load", "read_toml"]

T = TypeVar("T")

#: TOML's names of the values it parses to, for a refusal.
_TOML_TYPES = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"))
#: What a field of each scalar annotation takes, one and many.
_NAMES: dict[object, tuple[str, str]] = {
    bool: ("a boolean", "booleans"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    Path: ("a path (a non-empty string)", "paths (non-empty strings)"),
}


def read_toml(path: Path, source: str) -> dict[str, object]:
    """The top-level table of the TOML file ``path``; ``source`` names it in a refusal (``the serve config
    /etc/serve.toml``).

    Raises:
        FileNotFoundError: there is no such file (a caller whose file is optional reads that as "no settings").
        InvalidSpec: it cannot be read, or is not TOML (the message has the line and column).
    """
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InvalidSpec(f"cannot read {source}: {exc.strerror or exc}; check the path and its permissions") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # a decode error's text ends "(at line N, column M)"
        raise InvalidSpec(f"{source} is not valid TOML: {exc}; fix it") from None


def load(cls: type[T], path: Path, source: str, *, missing_ok: bool = False) -> T:
    """The file's top-level table as a ``cls`` (see :func:`from_table`); with ``missing_ok``, a missing file is
    ``cls()``: every setting at its default."""
    try:
        data = read_toml(path, source)
    except FileNotFoundError:
        if not missing_ok:
            raise InvalidSpec(f"cannot read {source}: there is no such file; check the path") from None
        data = {}
    return from_table(cls, data, source)


def from_table(
    cls: type[T], table: Mapping[str, object], source: str, *, at: str = "", fixed: Mapping[str, object] | None = None
) -> T:
    """``table`` (read from ``source``, at the dotted key ``at``; ``""``: the top level) as a ``cls``, a
    dataclass; ``fixed`` gives fields that do not come from the table (a table's name), which it may not set.

    Raises:
        InvalidSpec: a key ``cls`` has no field for (naming the keys it takes), a value of another type than its
            field's, a required key left out, or a value ``cls`` refuses when built.
    """
    fixed = fixed or {}
    hints = typing.get_type_hints(cls)
    settable = [f for f in dataclasses.fields(cls) if f.init and f.name not in fixed]  # type: ignore[arg-type]
    names = [f.name for f in settable]
    where = f"[{at}]" if at else "the top level"
    for key in table:
        if key not in names:
            raise InvalidSpec(f"{source}: unknown key {_dotted(at, key)}; {where} takes {', '.join(names)}")
    values = dict(fixed)
    for field in settable:
        if field.name in table:
            values[field.name] = _value(table[field.name], hints[field.name], source, _dotted(at, field.name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise InvalidSpec(f"{source}: {where} needs the key {field.name} ({_expected(hints[field.name])})")
    try:
        return cls(**values)
    except InvalidSpec as exc:
        raise InvalidSpec(f"{source}: {exc}") from None


def _dotted(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _value(value: object, hint: object, source: str, key: str) -> object:
    """``value`` as the annotation ``hint`` takes it, or ``InvalidSpec`` naming ``key`` and what it takes."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:  # TOML has no null: X | None is X, or the key left out
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return _value(value, kinds[0], source, key)
        for kind in kinds:
            try:
                return _value(value, kind, source, key)
            except InvalidSpec:
                continue
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if isinstance(value, list):
            return tuple(_value(item, args[0], source, f"{key}[{i}]") for i, item in enumerate(value))
    elif origin is Mapping or origin is dict:
        if isinstance(value, dict) and args[1] is object:  # a free table (a backend's options): checked by its user
            return dict(value)
        if isinstance(value, dict):
            return {k: _value(v, args[1], source, _dotted(key, k)) for k, v in value.items()}
    elif origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in args):
            return value
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, dict):
            return from_table(hint, value, source, at=key)
    elif _scalar(value, hint):
        return Path(value) if hint is Path and isinstance(value, str) else value
    raise InvalidSpec(f"{source}: {key} must be {_expected(hint)}, not {_toml_type(value)}")


def _scalar(value: object, hint: object) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # a boolean is an int to Python, never a number here
        return False
    if hint is float:
        return isinstance(value, (int, float))
    if hint is Path:
        return isinstance(value, str) and value != ""
    if hint in (int, str):
        return isinstance(value, hint)
    raise TypeError(f"a config field's annotation this reader does not map: {hint!r}")


def _expected(hint: object) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return " or ".join(_expected(a) for a in args if a is not type(None))
    if origin is tuple:
        return f"an array of {_NAMES[args[0]][1]}" if args[0] in _NAMES else "an array"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is Mapping or origin is dict or dataclasses.is_dataclass(hint):
        return "a table"
    return _NAMES[hint][0] if hint in _NAMES else str(hint)


def _toml_type(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    return next((name for kind, name in _TOML_TYPES if isinstance(value, kind)), "a date or time")
