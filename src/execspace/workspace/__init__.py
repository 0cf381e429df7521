"""Workspaces: layout, confined file access, metadata, staging.

This face is the package's API for the floors above the Engine seam (tools, server, CLI): the path rules a
workspace-relative path obeys, confined access to a host tree, the workspace's record and staging. Those floors
import from here, never from the package's modules, which are the backends' machinery and change with them
(tests/test_architecture.py checks it for tools/). The names load on first use, so importing one module of the
package does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .confine import ConfinedRoot
    from .confinecore import split_relpath
    from .hostfs import normalize_globs
    from .hostroots import HostRoots
    from .metadata import refuse_record
    from .staging import Stager, load_ws_metadata, save_ws_metadata
    from .xattrs import check_file_metadata

__all__ = [
    "ConfinedRoot",
    "HostRoots",
    "Stager",
    "check_file_metadata",
    "load_ws_metadata",
    "normalize_globs",
    "refuse_record",
    "save_ws_metadata",
    "split_relpath",
]

_LAZY = {
    "ConfinedRoot": ".confine",
    "HostRoots": ".hostroots",
    "Stager": ".staging",
    "check_file_metadata": ".xattrs",
    "load_ws_metadata": ".staging",
    "normalize_globs": ".hostfs",
    "refuse_record": ".metadata",
    "save_ws_metadata": ".staging",
    "split_relpath": ".confinecore",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
