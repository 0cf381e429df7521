"""``execspace serve``: an E2B-compatible sandbox server, so the official E2B SDK runs unchanged against this host.

One ASGI application (:class:`E2BApp`) serves E2B's control plane and every sandbox's envd and code interpreter on
one port; each sandbox is a workspace on an Engine the server opens, reached only through the Engine seam (its code
interpreter's kernels too: programs of the sandbox, started like its commands). See docs/server.md.
"""

from __future__ import annotations

from .app import E2BApp
from .options import ENVD_VERSION, TLS, ServerOptions, generate_api_key
from .sandboxes import Sandboxes
from .serve import serve
from .shares import ShareLimits
from .templates import BUILTIN_TEMPLATES, Template, load_config, load_environments

__all__ = [
    "BUILTIN_TEMPLATES",
    "ENVD_VERSION",
    "TLS",
    "E2BApp",
    "Sandboxes",
    "ServerOptions",
    "ShareLimits",
    "Template",
    "generate_api_key",
    "load_config",
    "load_environments",
    "serve",
]
