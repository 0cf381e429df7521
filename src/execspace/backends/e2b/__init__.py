"""The e2b backend: workspaces and programs in remote sandboxes over the E2B protocol (E2B cloud, Cube Sandbox,
a self-hosted E2B, ``execspace serve``), through the official ``e2b`` SDK's async API.

Each workspace is a directory with the standard layout in a sandbox; which sandbox is the persistence option's
choice (see :class:`E2BOptions`). Files move through the SDK's files API, programs run through its commands API;
the sandbox is the boundary, and :meth:`E2BBackend.capabilities` says so.
"""

from __future__ import annotations

import importlib.util
import os

from ...backend import Probe
from ...capabilities import Capabilities, Isolation, KernelCapabilities
from ...engine import BaseEngine, KernelEngine
from ...tracing import NO_TRACER
from .fs import E2BWorkspaceFS, E2BWorkspaceManager
from .kernels import LANGUAGE_NAMES, E2BKernels, kernel_language
from .options import E2BOptions
from .runner import E2BRunner
from .sandboxes import Sandboxes

__all__ = ["E2BBackend", "E2BOptions"]


class E2BBackend:
    """The factory registered as ``e2b``."""

    name = "e2b"
    options = E2BOptions

    @classmethod
    async def probe(cls, options: E2BOptions, /) -> Probe:
        if importlib.util.find_spec("e2b") is None:
            return Probe(False, "the e2b SDK is not installed", "pip install 'execspace[e2b]'")
        if not (options.api_key or os.environ.get("E2B_API_KEY")):
            return Probe(False, "no API key for the E2B service", "pass api_key=... or set E2B_API_KEY")
        if not (options.api_url or os.environ.get("E2B_API_URL") or options.domain or os.environ.get("E2B_DOMAIN")):
            # the SDK would pick E2B's cloud: fine when meant, so say where calls go rather than refuse
            return Probe(True, "no api_url or domain given: the SDK uses E2B's cloud (api.e2b.app)")
        return Probe(True)

    @classmethod
    def capabilities(cls, options: E2BOptions) -> Capabilities:
        isolation = Isolation.MICROVM if options.isolation == "microvm" else Isolation.REMOTE
        return Capabilities(
            backend="e2b",
            isolation=isolation,
            network_control=not options.allow_internet_access,
            network_default=options.allow_internet_access,
            network_domains=options.network is not None,
            clean_env=True,
            read_only_mounts=False,
            streaming=True,
            binary_output=False,  # the SDK's command handle decodes the output as UTF-8, errors="replace"
            pty=True,
            persistent_state=options.persistence == "session",
            host_paths=False,
            enforced_limits=frozenset({"timeout", "output_bytes"}),
            languages=("python", "bash"),  # what every template has (the file agent needs python3 anyway)
            kernels=KernelCapabilities(
                languages=tuple(dict.fromkeys(LANGUAGE_NAMES[kernel_language(t)] for t in options.code_languages)),
                isolation=isolation,
                cell_limits=frozenset({"timeout", "output_bytes"}),
                network_control=not options.allow_internet_access,
            ),
            does_not_protect=(
                "the sandbox service's own boundary is the protection: a program can read and change everything "
                "of its sandbox (other workspaces sharing a sandbox given by sandbox_id too)",
                "resource limits are the template's (cpu, memory, disk), not per run",
            ),
            details={
                "template": options.template,
                "persistence": options.persistence,
                "pty": "through the SDK's sandbox.pty: its login bash execs the program from PROMPT_COMMAND, before "
                "any prompt (a template whose login files replace PROMPT_COMMAND would show a shell instead)",
                "output": "a command's stdout and stderr come as text from the SDK (UTF-8, other bytes as U+FFFD); a "
                "pty's output comes as bytes; write binary output to a file and read it with the file API",
                "signals": "sent with kill inside the sandbox (the SDK's envd signal call sends only SIGKILL)",
                "fork": "detected at first use: snapshots and forks of whole sandboxes where the service keeps "
                "files-only snapshots (execspace serve; manager.fork_mode() says how it forks); CapabilityError "
                "elsewhere (E2B cloud) and for workspaces sharing a sandbox_id",
                "pause": "manager.pause(ws) / resume(ws) where the service pauses sandboxes (E2B cloud, execspace "
                "serve), detected at the first pause; the next call on a paused workspace resumes it; "
                "CapabilityError elsewhere and for a sandbox given by sandbox_id",
            },
        )

    @classmethod
    async def open(cls, options: E2BOptions, /) -> BaseEngine:
        from ...errors import SetupFailed

        probe = await cls.probe(options)
        if not probe.ok:
            raise SetupFailed("e2b", probe.reason, probe.fix)
        caps = cls.capabilities(options)
        boxes = Sandboxes(options)
        boxes.start()
        tracer = options.tracer or NO_TRACER
        audit = options.audit
        fs = E2BWorkspaceFS(boxes, options.artifacts, options.host_roots, tracer, audit)
        kernels = E2BKernels(boxes, fs, audit)
        manager = E2BWorkspaceManager(boxes, kernels.shutdown, tracer, audit)
        runner = E2BRunner(boxes, lambda: caps, options.env_policy, options.kill_grace, tracer, audit)
        return KernelEngine("e2b", manager, fs, runner, caps, kernels, on_close=boxes.aclose)
