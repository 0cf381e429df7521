"""A template's environment built where the server runs, the first time a create needs it.

A create of a template whose environment is not built here starts its build (one at a time per environment: the
creates that come meanwhile wait for the same build, and the store's lock makes a build by another process on
the same store, as ``execspace env build``, a wait too) and waits for it at most ``ServerOptions.build_wait``
seconds: a build that takes longer answers the create 503 with ``Retry-After`` (:class:`EnvironmentBuilding`,
naming the environment, where it is built, its step and its log), and goes on; the retry waits for it again. A
failed build fails the creates that wait for it (:class:`EnvironmentBuildFailed`, naming where and the log), or,
when none did (each had answered 503 before it failed), the next create; the create after that tries again. Each
step is a line of the server's log (``execspace.server.builds``); every line of every attempt, pip's too, is in
the build's log in the store (``<store>/.logs/NAME.log``), out of every sandbox's reach as the store is.

Only an environment with a known spec is built (a built-in, or ``[environments.NAME]`` of serve's config file):
one known only by name fails the create with ``EnvironmentNotFound`` naming ``execspace env build``, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..environments import BuildEvent, Environment, EnvironmentSpec, EnvironmentStore, builtin_spec, canonical_name
from ..errors import EnvironmentBuildFailed, EnvironmentBuilding, EnvironmentNotFound

__all__ = ["LOGGER", "EnvironmentBuilds"]

#: The logger of the builds' progress (INFO: a line per step).
LOGGER = "execspace.server.builds"
_log = logging.getLogger(LOGGER)
#: Seconds a create that found its build still running is told to wait before it retries (``Retry-After``). The
#: official SDK retries a 503 itself, by default 3 times within its 60 s request timeout: with the default wait
#: (``ServerOptions.build_wait``, 10 s) its attempts end at 10, 24, 38 and 52 s, so a build of up to about 50 s is
#: waited for without the caller seeing anything, and a longer one answers the 503 naming it before the SDK's
#: timeout, never a timeout.
RETRY_AFTER = 4


@dataclass
class _Build:
    """One attempt at building an environment here."""

    log: Path
    started: float = field(default_factory=time.monotonic)
    step: str = "python"
    task: asyncio.Task[Environment] | None = None
    waiters: int = 0
    """Creates waiting for it now: a failure none of them sees is answered to the next create instead."""

    def state(self) -> str:
        return f"step {self.step}, {time.monotonic() - self.started:.0f} s so far"


class EnvironmentBuilds:
    """Builds the environments of ``specs`` (and the built-ins) into ``store`` when a create first needs them;
    ``where`` names this server in logs and errors (``node 1f2e… (10.0.0.5)``)."""

    def __init__(
        self, specs: Mapping[str, EnvironmentSpec], where: str, *, wait: float, store: EnvironmentStore | None = None
    ) -> None:
        self._specs = specs
        self._where = where
        self._wait = wait
        self._store = store or EnvironmentStore()
        self._builds: dict[str, _Build] = {}
        self._failed: dict[str, str] = {}  # name -> why its last build failed (said to the creates that wait next)
        self._unseen: dict[str, EnvironmentBuildFailed] = {}  # a failure no create waited for: the next one's

    def spec(self, name: str) -> EnvironmentSpec | None:
        """The spec this server builds ``name`` from: serve's config file's, else a built-in's; None: unknown."""
        return self._specs.get(canonical_name(name)) or builtin_spec(name)

    async def ready(self, name: str) -> Environment:
        """The environment ``name``: built here already, or built now (waited for at most ``wait`` seconds).

        Raises:
            EnvironmentNotFound: not built here, and no spec of it is known.
            EnvironmentBuilding: its build is still running after ``wait`` seconds (it goes on).
            EnvironmentBuildFailed: its build failed (the next call builds again).
        """
        try:
            return self._store.get(name)
        except EnvironmentNotFound:
            spec = self.spec(name)
            if spec is None:
                raise
        unseen = self._unseen.pop(spec.name, None)
        if unseen is not None:  # its creates had answered 503 before it failed: the retry learns why
            raise unseen
        build = self._builds.get(spec.name)
        if build is None or build.task is None or build.task.done():
            build = self._start(spec)
        else:
            _log.info(
                "a create waits for the build of environment %s on %s (%s)", spec.name, self._where, build.state()
            )
        assert build.task is not None
        build.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(build.task), self._wait)
        except TimeoutError:
            last = self._failed.get(spec.name)
            before = f"; its last build failed: {last}" if last else ""
            raise EnvironmentBuilding(
                f"environment {spec.name!r} is being built on {self._where} ({build.state()}; its log: {build.log}; "
                f"the server's log shows each step){before}: retry in a few seconds"
            ) from None
        finally:
            build.waiters -= 1

    def _start(self, spec: EnvironmentSpec) -> _Build:
        build = _Build(self._store.root / ".logs" / f"{spec.name}.log")
        build.task = asyncio.create_task(self._run(spec, build))
        build.task.add_done_callback(_retrieved)  # a build whose creates all gave up must not warn unretrieved
        self._builds[spec.name] = build
        return build

    async def _run(self, spec: EnvironmentSpec, build: _Build) -> Environment:
        _log.warning("building environment %s on %s (its log: %s)", spec.name, self._where, build.log)
        self._store.create()  # the store's directories 0755, as a build makes them: the sandboxes' uids pass them
        with _open_log(build.log) as log:
            log.write(f"=== build of {spec.name} on {self._where}, {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n")

            def progress(event: BuildEvent) -> None:
                log.write(f"{'    ' if event.output else ''}{event.step}: {event.text}\n")
                log.flush()
                if not event.output:
                    build.step = event.step
                    _log.info(
                        "environment %s on %s: [%5.1fs] %s: %s",
                        spec.name,
                        self._where,
                        _since(build),
                        event.step,
                        event.text,
                    )

            try:
                env = await self._store.build(spec, progress=progress)
            except Exception as exc:  # a step failed (or the store's disk): the creates say so, the next retries
                failed = exc if isinstance(exc, EnvironmentBuildFailed) else None
                cause = failed.cause if failed is not None else repr(exc)
                self._failed[spec.name] = cause.splitlines()[0]
                log.write(f"=== failed: {cause}\n")
                _log.error(
                    "the build of environment %s on %s failed (its log: %s): %s",
                    spec.name,
                    self._where,
                    build.log,
                    cause,
                )
                error = EnvironmentBuildFailed(
                    f"environment {spec.name!r} could not be built on {self._where} (its log: {build.log}): {cause}",
                    (failed.fix if failed is not None else "")
                    or "fix its spec, or the host's access to the package registry; the next create builds it again",
                )
                if build.waiters == 0:
                    self._unseen[spec.name] = error
                raise error from None
        self._failed.pop(spec.name, None)
        _log.warning("environment %s is built on %s in %.1f s: %s", spec.name, self._where, _since(build), env.path)
        return env

    async def close(self) -> None:
        """Stop the builds still running (each kills its pip and leaves nothing behind)."""
        tasks = [b.task for b in self._builds.values() if b.task is not None and not b.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _since(build: _Build) -> float:
    return time.monotonic() - build.started


@contextlib.contextmanager
def _open_log(path: Path) -> Iterator[IO[str]]:
    """The build's log, appended to (one section per attempt); only this server's user reads it."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8", errors="replace") as f:
        yield f


def _retrieved(task: asyncio.Task[Environment]) -> None:
    if not task.cancelled():
        task.exception()
