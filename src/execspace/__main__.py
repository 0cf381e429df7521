"""``python -m execspace``: the same as the ``execspace`` command."""

from __future__ import annotations

from .cli.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
