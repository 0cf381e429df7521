"""Tool definitions shared by every agent-facing tool: the spec, its renderings, argument checks, results.

A tool is a :class:`ToolSpec` (name, description, JSON-schema parameters) plus an async
``call(arguments) -> dict`` that returns JSON-ready data for the model (:class:`Tool`).
``ToolSpec.openai()`` and ``ToolSpec.anthropic()`` give the definitions those APIs take as is.

Schemas are deliberately small: :data:`SCHEMA_KEYWORDS` lists every keyword a spec may use,
and :func:`check_arguments` enforces exactly those, so what the model was promised is what
the tool accepts (a spec with any other keyword is refused when it is built).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import ExecspaceError, InvalidSpec

__all__ = [
    "SCHEMA_KEYWORDS",
    "InvalidArguments",
    "Tool",
    "ToolArguments",
    "ToolSpec",
    "check_arguments",
    "decode_arguments",
    "error_result",
]

#: What a tool call's arguments arrive as: a mapping, or the JSON text of one (OpenAI's ``function.arguments``).
ToolArguments = Mapping[str, Any] | str

#: JSON-schema keywords a tool's parameters may use (and :func:`check_arguments` enforces).
SCHEMA_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "default",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "maxItems",
    }
)
# both OpenAI and Anthropic accept exactly this for tool names
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class InvalidArguments(InvalidSpec):
    """The model's arguments do not match the tool's schema."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function tool as the model sees it."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    """JSON schema of the arguments: an ``object`` using only :data:`SCHEMA_KEYWORDS`."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidSpec(f"tool name {self.name!r} must match {_NAME.pattern}")
        if not self.description.strip():
            raise InvalidSpec(f"tool {self.name!r} needs a description")
        if self.parameters.get("type") != "object":
            raise InvalidSpec(f"parameters of tool {self.name!r} must be a JSON schema of type 'object'")
        _check_schema(self.parameters, self.name)

    def openai(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry (``{"type": "function", "function": {...}}``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.json_schema()},
        }

    def openai_responses(self) -> dict[str, Any]:
        """The Responses API ``tools`` entry (flat: ``{"type": "function", "name": ...}``)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.json_schema(),
        }

    def anthropic(self) -> dict[str, Any]:
        """The Anthropic Messages ``tools`` entry (``input_schema``)."""
        return {"name": self.name, "description": self.description, "input_schema": self.json_schema()}

    def json_schema(self) -> dict[str, Any]:
        """A deep copy of the parameters schema: callers may change it without touching the spec."""
        return copy.deepcopy(dict(self.parameters))


@runtime_checkable
class Tool(Protocol):
    """What an agent framework needs from a tool: its spec and a call returning JSON-ready data."""

    @property
    def spec(self) -> ToolSpec: ...

    async def call(self, arguments: ToolArguments) -> dict[str, Any]: ...


def error_result(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A tool result telling the model what went wrong, instead of an exception it never sees."""
    result: dict[str, Any] = {"status": "error", "error": str(exc), "error_type": type(exc).__name__}
    if isinstance(exc, ExecspaceError):
        for attr in ("rule", "capability", "path"):
            value = getattr(exc, attr, None)
            if isinstance(value, str) and value:
                result[attr] = value
    result.update(extra)
    return result


# -- argument checks -----------------------------------------------------------------------


def decode_arguments(arguments: object) -> Mapping[str, Any]:
    """The arguments as a mapping: one as is, or the JSON object a string holds (APIs send either).

    Raises:
        InvalidArguments: anything else, or a string that is not the JSON text of an object.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise InvalidArguments(f"arguments are a string that is not JSON ({exc}); send a JSON object") from None
    if not isinstance(arguments, Mapping):
        raise InvalidArguments(f"arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def check_arguments(schema: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    """Return ``arguments`` as a dict if they match ``schema``, with defaults filled in.

    Raises:
        InvalidArguments: naming the first argument that does not match, and why.
    """
    arguments = decode_arguments(arguments)
    _check_value(schema, arguments, "arguments")
    result = dict(arguments)
    for name, prop in schema.get("properties", {}).items():
        if name not in result and "default" in prop:
            result[name] = copy.deepcopy(prop["default"])
    return result


def _check_value(schema: Mapping[str, Any], value: Any, where: str) -> None:
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        raise InvalidArguments(f"{where} must be of type {kind}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise InvalidArguments(f"{where} must be one of {schema['enum']}, got {value!r}")
    if isinstance(value, str):
        _check_length(schema, len(value), where, "characters")
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise InvalidArguments(f"{where} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise InvalidArguments(f"{where} must be at most {schema['maximum']}, got {value}")
    if isinstance(value, Mapping):
        _check_object(schema, value, where)
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise InvalidArguments(f"{where} has more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            _check_value(schema.get("items", {}), item, f"{where}[{i}]")


def _check_object(schema: Mapping[str, Any], value: Mapping[Any, Any], where: str) -> None:
    props: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise InvalidArguments(f"{where} is missing the required field {name!r}")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidArguments(f"{where} has a non-string key {key!r}")
        label = f"{key!r}" if where == "arguments" else f"{where}.{key}"
        if key in props:
            _check_value(props[key], item, label)
        elif extra is False:
            known = ", ".join(sorted(props)) or "none"
            raise InvalidArguments(f"unknown field {label} (known fields: {known})")
        elif isinstance(extra, Mapping):
            _check_value(extra, item, label)


def _check_length(schema: Mapping[str, Any], n: int, where: str, unit: str) -> None:
    if "minLength" in schema and n < schema["minLength"]:
        raise InvalidArguments(f"{where} must have at least {schema['minLength']} {unit}")
    if "maxLength" in schema and n > schema["maxLength"]:
        raise InvalidArguments(f"{where} must have at most {schema['maxLength']} {unit}, got {n}")


def _is_type(value: Any, kind: str) -> bool:
    # JSON has no bool-is-int: True must not pass as an integer, nor 1.5 as one
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, ()))


def _check_schema(schema: Mapping[str, Any], where: str) -> None:
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise InvalidSpec(f"schema of {where} uses unsupported keyword(s) {sorted(unknown)}; see SCHEMA_KEYWORDS")
    kind = schema.get("type")
    if kind is not None and kind not in _TYPES:
        raise InvalidSpec(f"schema of {where} has unknown type {kind!r}")
    for name, prop in schema.get("properties", {}).items():
        _check_schema(prop, f"{where}.{name}")
    for name in schema.get("required", ()):
        if name not in schema.get("properties", {}):
            raise InvalidSpec(f"schema of {where} requires {name!r}, which is not a property")
    for sub in ("items", "additionalProperties"):
        if isinstance(schema.get(sub), Mapping):
            _check_schema(schema[sub], f"{where}.{sub}")
