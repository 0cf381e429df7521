"""The ``execspace`` command line: ``run``, ``exec-code``, ``doctor``, ``demo`` and ``daemon``.

Entry point :func:`execspace.cli.launcher.main` (console script ``execspace``, and
``python -m execspace``): it hands the command to a warm daemon when one runs, else calls
:func:`execspace.cli.main.main` here.
"""

from __future__ import annotations

from .launcher import main

__all__ = ["main"]
