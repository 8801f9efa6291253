"""The agent's provision loop: converging on the control plane's engines, and re-checking them.

A Provision message kicks a pass; passes repeat every ten minutes, because an
unrelated upgrade can remove a library an installed engine needs; after a
pass with a failure the next comes after a minute, doubling back to ten: a
lock held by a new machine's own updates clears in a minute or two, and ten
minutes' wait left a node idle for nothing.

What the node reports as its engines is what this loop installed and saw
run, plus what agent.yaml names on purpose. Never something merely found on
PATH: a llama-server somebody once unpacked is not necessarily one that
works, and placing on it is how a replica fails on a node nobody watches.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import time
from collections.abc import Callable

import attrs
import structlog

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import FAILED, READY, UNSUPPORTED, Installer, InstallStatus, Source, Want
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandRunner
from llmgw.agent.provision.wheels import WheelSource
from llmgw.backoff import ExponentialBackoff
from llmgw.config import AgentConfig
from llmgw.launcher import CommandResult
from llmgw.launcher import run as run_command
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# The version reported for an engine agent.yaml names by its binary. A value,
# not an absent key: absent means "this node cannot run it". The binary is not
# run to ask, because people put wrapper scripts in front of an engine that
# start a server when handed a flag they do not know. (An interpreter is run,
# with llmgw's own one-line import and no flags: see _MODULES.)
UNKNOWN_VERSION = "unknown"

# Engines that ship inside llmgw itself: never installed, never missing.
_BUILT_IN = frozenset({"sim"})

# Engines agent.yaml names by the interpreter they are installed in, with the
# module that interpreter must import. Being there says nothing for these:
# python3 is on every machine, and believing it put SGLang replicas on nodes
# that had no SGLang, to fail there minutes later.
_MODULES = {"sglang": "sglang"}
# Generous: an import on a cold page cache pulls in torch, and takes seconds.
IMPORT_TIMEOUT_S = 120.0
_VERSION = re.compile(r"[0-9][A-Za-z0-9._+-]{0,63}")

EVERY_S = 600.0
FIRST_RETRY_S = 60.0


class ProvisionLoop:
    """Installs and re-checks the engines the control plane wants on this node.

    Feed it every Provision with `kick`; run `run()` as a task the agent owns.
    `changed` is set (and `on_change` called) whenever `statuses()` or
    `engine_versions()` would answer differently; the heartbeat clears it.
    """

    def __init__(
        self,
        cfg: AgentConfig,
        host: Host,
        runner: CommandRunner,
        releases: ReleaseClient,
        *,
        on_change: Callable[[], None] | None = None,
        every_s: float = EVERY_S,
        first_retry_s: float = FIRST_RETRY_S,
        lock_retry_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._clock = clock
        self._host = host
        self._on_change = on_change
        self._every_s = every_s
        # After a failed pass: a minute, doubling back to the regular pass.
        self._backoff = ExponentialBackoff(base_s=first_retry_s, cap_s=every_s)
        # Passes in a row with a failure.
        self._failures = 0
        self.installer = Installer(
            cfg.engines_dir, host, runner, releases, on_status=self._heard, lock_retry_s=lock_retry_s
        )
        # None until the first Provision: a node that has not been told what to
        # have installs nothing and reports no installs.
        self._wants: list[Want] | None = None
        self._source = Source()
        self._statuses: dict[str, InstallStatus] = {}
        self._installed: dict[str, InstallStatus] = {}
        self._configured: dict[str, str] = {}
        # Engines agent.yaml names that cannot run here, with the sentence saying why.
        self._unavailable: dict[str, InstallStatus] = {}
        # Interpreter -> its module's version, or why it does not import. Once, because
        # probing SGLang imports it in a Python interpreter, seconds on a cold cache,
        # and a reconnect (a Provision, so a pass) is not a reason to pay that again.
        self._imports: dict[tuple[str, str], _Runnable] = {}
        self._probed = False
        self._kicked = asyncio.Event()
        self.changed = asyncio.Event()
        # When the next pass comes if nothing kicks one sooner.
        self.next_pass_s = every_s
        # The clock's time of the next pass after one that failed; None while nothing failed.
        # Reported with each failed install, so "failed to install" says when it is tried again.
        self._next_try: float | None = None
        # Counted and signalled, for whoever waits on a pass to finish.
        self.passes = 0
        self.passed = asyncio.Event()

    # -- what the agent reports -------------------------------------------------

    @property
    def probed(self) -> bool:
        """Whether engine_versions() is an answer yet (Register's engines_probed)."""
        return self._probed

    def engine_versions(self) -> dict[str, str]:
        """Engine -> version this node can run: installed and seen to run, or named in agent.yaml."""
        out = dict(self._configured)
        # Installed wins: it is the one that was seen to run.
        out.update({name: st.version for name, st in self._installed.items()})
        return {name: v for name, v in out.items() if not self._cfg.engine_options(name).disabled}

    def binaries(self) -> dict[str, str]:
        """Engine -> the executable this loop installed, for launching it."""
        return {name: st.binary for name, st in self._installed.items()}

    def statuses(self) -> list[pb.ProvisionStatus]:
        """Where each wanted engine's installation stands, and why a named one cannot run, by engine name;
        a failed one with the seconds until it is tried again, counted from now (the agent's clock is
        not the server's)."""
        # Never the same engine in both: one agent.yaml names is never wanted (kick).
        every = {**self._unavailable, **self._statuses}
        out = [every[name].to_proto() for name in sorted(every)]
        if self._next_try is not None:
            next_try_s = max(0, math.ceil(self._next_try - self._clock()))
            for name, status in zip(sorted(every), out, strict=True):
                if status.state == FAILED and name in self._statuses:
                    status.next_try_s = next_try_s
        return out

    # -- what the control plane says --------------------------------------------

    def kick(self, provision: pb.Provision) -> None:
        """Take the control plane's wanted engines and start a pass now."""
        wants: list[Want] = []
        for want in provision.engines:
            name = want.engine
            if not name or not want.version or name in _BUILT_IN:
                continue
            if self._cfg.engine_options(name).disabled:
                continue  # agent.yaml's say wins over the control plane's
            if self._by_hand(name):
                # The operator named a binary for it: a local build, a CUDA
                # runtime of their own. An installed one beside it would be
                # used first and quietly replace theirs.
                continue
            wants.append(Want(name, want.version))
        self._wants = wants
        self._source = Source(base_url=provision.base_url, checksums=dict(provision.checksums))
        # An engine no longer wanted is no longer reported on.
        keep = {w.engine for w in wants}
        dropped = [n for n in (*self._statuses, *self._installed) if n not in keep]
        for name in dropped:
            self._statuses.pop(name, None)
            self._installed.pop(name, None)
        if dropped:
            self._notify()
        self._kicked.set()

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        """Pass on every kick and every `next_pass_s`, until cancelled."""
        log.info(
            "this machine",
            host=self._host.describe(),
            family=self._host.family or "unknown",
            cpu_flags=" ".join(self._host.cpu_flags),
            warnings=self._host.warnings(),
        )
        await self.probe_configured()
        while True:
            try:
                async with asyncio.timeout(self.next_pass_s):
                    await self._kicked.wait()
            except TimeoutError:
                pass
            self._kicked.clear()
            await self.probe_configured()
            if self._wants is not None:
                await self.run_pass()

    async def run_pass(self) -> list[InstallStatus]:
        """One pass over the wanted engines; the next pass's delay follows its outcome."""
        results: list[InstallStatus] = []
        for want in list(self._wants or ()):
            results += await self.installer.converge([want], self._source_for(want.engine))
        if any(st.state == FAILED for st in results):
            self._failures += 1
            self.next_pass_s = self._backoff.delay(self._failures)
            self._next_try = self._clock() + self.next_pass_s
            # The failure was reported as it happened, before its next try was known.
            self._notify()
        else:
            self._failures = 0
            self.next_pass_s = self._every_s
            self._next_try = None
        # Only what is still wanted: a Provision that arrived during the pass may have dropped one.
        still = {w.engine for w in self._wants or ()}
        installed = {st.engine: st for st in results if st.state == READY and st.engine in still}
        if _versions(installed) != _versions(self._installed):
            log.info("engines installed and running", engines=_versions(installed))
            self._notify()
        self._installed = installed
        self.passes += 1
        self.passed.set()
        return results

    async def probe_configured(self) -> None:
        """Look for the engines agent.yaml names; the only engines believed without installing."""
        found: dict[str, str] = {}
        unavailable: dict[str, InstallStatus] = {}
        for name, opts in self._cfg.engines.items():
            if not opts.binary or opts.disabled:
                continue
            runnable = await self._runnable(name, opts.binary)
            if runnable.why:
                unavailable[name] = InstallStatus(name, UNKNOWN_VERSION, FAILED, runnable.why)
            else:
                found[name] = runnable.version
        for name in unavailable.keys() - self._unavailable.keys():
            log.warning("an engine agent.yaml names cannot run", engine=name, why=unavailable[name].detail)
        changed = found != self._configured or unavailable != self._unavailable or not self._probed
        self._configured, self._unavailable, self._probed = found, unavailable, True
        if changed:
            self._notify()

    async def _runnable(self, engine: str, binary: str) -> _Runnable:
        """Whether agent.yaml's binary for engine can run it: there, and for a module, importing it."""
        path = await asyncio.to_thread(_executable, binary)
        if not path:
            where = "an executable file here" if os.sep in binary else "on the PATH"
            return _Runnable(why=f"agent.yaml names {binary}, which is not {where}")
        module = _MODULES.get(engine)
        if module is None:
            return _Runnable()
        key = (path, module)
        if key not in self._imports:
            runnable = await _imports(path, module)
            if runnable.timed_out:
                return runnable  # a slow disk, not an answer: asked again on the next pass
            self._imports[key] = runnable
        return self._imports[key]

    # -- internals ----------------------------------------------------------------

    def _source_for(self, engine: str) -> Source:
        """The control plane's mirror for archives; agent.yaml's index or wheelhouse for pip's wheels.

        The wheels' source is the node's to say: a PyPI mirror or a wheelhouse is a fact of the site's
        network, and PyTorch's index, unreachable from a closed network, cost pip minutes of retries
        before it failed.
        """
        opts = self._cfg.engine_options(engine)
        return attrs.evolve(
            self._source, wheels=WheelSource(index_url=opts.index_url, wheelhouse=opts.wheelhouse)
        )

    def _by_hand(self, engine: str) -> bool:
        return bool(self._cfg.engine_options(engine).binary)

    def _heard(self, st: InstallStatus) -> None:
        if self._wants is None or st.engine not in {w.engine for w in self._wants}:
            return
        prev = self._statuses.get(st.engine)
        self._statuses[st.engine] = st
        if st.state == READY and self._installed.get(st.engine) != st:
            self._installed[st.engine] = st
        if prev is not None and (prev.state, prev.detail, prev.variant) == (st.state, st.detail, st.variant):
            return
        fields = {"engine": st.engine, "version": st.version, "variant": st.variant, "state": st.state}
        if st.state in (FAILED, UNSUPPORTED):
            log.warning("engine installation", detail=st.detail, **fields)
        else:
            log.info("engine installation", detail=st.detail, **fields)
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        if self._on_change is not None:
            self._on_change()


def _versions(installed: dict[str, InstallStatus]) -> dict[str, str]:
    return {name: st.version for name, st in sorted(installed.items())}


@attrs.frozen
class _Runnable:
    """An engine agent.yaml names: its version when it can run here, else why not."""

    version: str = UNKNOWN_VERSION
    why: str = ""
    timed_out: bool = False


def _executable(binary: str) -> str:
    """The path binary runs from, or "" when there is none (blocking: in a thread)."""
    if os.sep in binary:
        return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else ""
    return shutil.which(binary) or ""


async def _imports(python: str, module: str) -> _Runnable:
    """Whether the interpreter imports module, and the version it says it is.

    This runs llmgw's own one-line import, not the engine's launcher: no wrapper
    script in front of a server is handed flags it would start one for.
    """
    code = f"import {module}; print(getattr({module}, '__version__', ''))"
    try:
        result = await run_command([python, "-c", code], timeout_s=IMPORT_TIMEOUT_S)
    except OSError as exc:
        return _Runnable(why=f"{python} cannot import {module}: {exc.strerror or exc}")
    if result.timed_out:
        return _Runnable(
            why=f"{python} did not import {module} within {IMPORT_TIMEOUT_S:g} s", timed_out=True
        )
    if not result.ok:
        return _Runnable(why=f"{python} cannot import {module}: {_last_words(result)}")
    # Its last line: whatever the import printed on the way comes before it.
    version = result.last_line()
    return _Runnable(version=version if _VERSION.fullmatch(version) else UNKNOWN_VERSION)


def _last_words(result: CommandResult) -> str:
    # The traceback's last line names the error: "ModuleNotFoundError: No module named 'sglang'".
    return result.last_line() or f"exit code {result.returncode}"
