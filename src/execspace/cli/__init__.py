"""The ``execspace`` command line: ``run``, ``exec-code``, ``doctor`` and ``demo``.

Entry point :func:`execspace.cli.main.main` (console script ``execspace``, and
``python -m execspace``).
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
