"""The Python that runs a sandboxed kernel: an interpreter the sandbox's uid can execute, with ipykernel.

Light on purpose (no ``zmq``, no ``jupyter_client``): ``execspace serve`` asks it at start-up, before any kernel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import site
import stat
import sys
from dataclasses import dataclass

from ...environments import Environment
from ...workspace.hostroots import closed_ancestor

__all__ = ["Interpreter", "environment_interpreter", "find_interpreter"]


@dataclass(frozen=True, slots=True)
class Interpreter:
    """The Python that runs sandboxed kernels: this process's own packages (ipykernel) from a
    Python the sandbox uid can execute."""

    path: str
    site_dirs: tuple[str, ...]
    """This environment's site-packages, added by the launcher (when ``path`` is not this venv's python)."""
    read_paths: tuple[str, ...]
    """Host directories the sandbox policy must let the kernel read (they are hidden by default)."""
    views: tuple[str, ...] = ()
    """Host trees the sandbox shows read-only although its uid cannot reach them (``SandboxOptions.read_views``):
    as root, the caller's venv and Python under ``/root`` or another 0700 directory."""


def find_interpreter() -> Interpreter | str:
    """The interpreter for sandboxed kernels, or why there is none.

    This venv's python may be a link to an interpreter the sandbox cannot reach: then the same ``X.Y`` from the
    sandbox's PATH runs this venv's site-packages. As root, where the packages lie under a directory the sandbox's
    uid cannot pass (``/root`` is 0700), or the interpreter does with no such ``X.Y`` in the sandbox, the sandbox
    shows their trees read-only (views) and the kernel runs this very venv's python.
    """
    from ..sandbox import hidden_by_default, which_in_sandbox

    own = os.path.realpath(sys.executable)
    dirs = tuple(d for d in site.getsitepackages() if os.path.isdir(d))
    if any(closed_ancestor(d) is not None for d in dirs):
        return _viewed(own, dirs)
    python = own if _reachable(own) else None
    if python is None:
        name = f"python{sys.version_info.major}.{sys.version_info.minor}"
        found = which_in_sandbox(name)
        python = found if found is not None and _reachable(found) else None
    if python is None and closed_ancestor(own) is not None:
        return _viewed(own, dirs)
    if python is None:
        return (
            f"no Python {sys.version_info.major}.{sys.version_info.minor} the sandbox can run ({own} is not reachable)"
        )
    for d in dirs:
        if not _reachable(d):
            return f"this environment's packages ({d}) are not readable by the sandbox uid"
    prefix = os.path.realpath(sys.prefix)
    return Interpreter(python, dirs, (prefix,) if hidden_by_default(prefix) else ())


def _viewed(own: str, dirs: tuple[str, ...]) -> Interpreter | str:
    """As root, this interpreter with its venv (``sys.prefix``) and installation (``sys.base_prefix``) shown to the
    sandbox as views, run as the venv's own python (so the venv's packages, not the installation's, are its
    site-packages); or why not."""
    prefix, base = os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)
    trees = tuple(dict.fromkeys(t for t in (prefix, base) if not _visible(t)))
    # the venv's bin/python (a link), at its canonical directory: the kernel finds the venv's pyvenv.cfg beside it
    exe = os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))
    for path in (*_link_chain(exe), own, *dirs, *_kernel_packages()):
        if not _visible(path) and not any(_under(path, t) for t in trees):
            where = ", ".join(trees)
            return (
                f"{path} is not readable by the sandbox uid: it lies outside this Python's trees ({where}), which the "
                "sandbox shows (a .pth or an editable install pointing elsewhere; install it into the venv)"
            )
    for tree in trees:
        mode = stat.S_IMODE(os.stat(tree).st_mode)
        if mode & 0o005 != 0o005:
            return (
                f"this environment ({tree}, mode {mode:04o}) is not readable by others, and as root the sandbox "
                "reads only what others may (execspace never changes your files' modes)"
            )
    return Interpreter(exe, dirs, (), trees)


def _kernel_packages() -> list[str]:
    """Where the packages a kernel imports first are (a ``.pth`` may put them anywhere), found without importing."""
    found = []
    for name in ("ipykernel", "zmq", "IPython"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            found.append(os.path.realpath(os.path.dirname(spec.origin)))
    return found


def _link_chain(path: str) -> list[str]:
    """``path`` and every path its symbolic links lead through, in order (at most 40 hops, as the kernel)."""
    chain = [path]
    for _ in range(40):
        try:
            target = os.readlink(chain[-1])
        except OSError:
            break
        nxt = os.path.join(os.path.dirname(chain[-1]), target)
        chain.append(os.path.join(os.path.realpath(os.path.dirname(nxt)), os.path.basename(nxt)))
    return chain


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _visible(path: str) -> bool:
    """Whether the sandbox shows ``path`` without a grant or view, and its uid reaches it."""
    from ..sandbox import hidden_by_default

    return not hidden_by_default(os.path.realpath(path)) and _reachable(path)


def environment_interpreter(environment: Environment) -> Interpreter | str:
    """The interpreter of a runtime environment (its own python, site-packages and ipykernel: the sandbox binds
    its tree), or why it cannot run kernels."""
    if not any(name.lower() == "ipykernel" for name in environment.packages):
        return (
            f"the environment {environment.name!r} has no ipykernel: add it to the spec's requirements and build "
            "again (the built-in code-interpreter has it)"
        )
    return Interpreter(str(environment.python), (), ())


def _reachable(path: str) -> bool:
    """Whether the sandbox uid can reach ``path``: as root that is a foreign uid, so only "other" bits count;
    otherwise the sandbox runs as us. Hidden top-level dirs (``/root``, ``/home``…) only through a grant."""
    real = os.path.realpath(path)
    if os.geteuid() != 0:
        return os.access(real, os.R_OK | os.X_OK)
    if closed_ancestor(real) is not None:
        return False
    with contextlib.suppress(OSError):
        return os.stat(real).st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
    return False
