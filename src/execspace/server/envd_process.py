"""envd's ``process.Process`` Connect service over the Engine's process API."""

from __future__ import annotations

from e2b.envd.process.process_connect import Process

from .rpc import ServiceBase

__all__ = ["ProcessService"]


class ProcessService(ServiceBase, Process):
    """Every method answers ``unimplemented`` until the Engine's process API is there."""
