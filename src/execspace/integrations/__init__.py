"""Adapters that let agent frameworks run their code in execspace workspaces.

One module per framework (``execspace.integrations.openai_agents``, ``.autogen``…), each over the Engine and the
tools. A framework is an optional extra: importing ``execspace`` imports none of them, and importing an adapter
whose framework is not installed raises :class:`MissingExtra` naming the ``pip install`` line.
"""

from __future__ import annotations

from ..errors import ExecspaceError

__all__ = ["MissingExtra"]


class MissingExtra(ExecspaceError, ImportError):
    """An adapter's framework is not installed; ``install`` is the line that installs it."""

    def __init__(self, extra: str, framework: str, cause: ImportError) -> None:
        self.extra = extra
        self.install = f"pip install 'execspace[{extra}]'"
        super().__init__(
            f"execspace.integrations needs {framework} for this adapter, and importing it failed ({cause}). "
            f"Fix: {self.install}",
            name=cause.name,
        )
