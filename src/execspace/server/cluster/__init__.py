"""``execspace serve --ray``: a front door serving E2B's API over node agents on a Ray cluster (docs/cluster.md).

Only this package imports ``ray`` (the ``ray`` extra), and only when a front door or an agent runs.
"""

from __future__ import annotations

from .frontdoor import serve_cluster

__all__ = ["serve_cluster"]
