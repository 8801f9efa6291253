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
import os
import shutil
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
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# The version reported for an engine agent.yaml names by its binary. A value,
# not an absent key: absent means "this node cannot run it". The binary is not
# run to ask, because people put wrapper scripts in front of an engine that
# start a server when handed a flag they do not know.
UNKNOWN_VERSION = "unknown"

# Engines that ship inside llmgw itself: never installed, never missing.
_BUILT_IN = frozenset({"sim"})

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
    ) -> None:
        self._cfg = cfg
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
        self._probed = False
        self._kicked = asyncio.Event()
        self.changed = asyncio.Event()
        # When the next pass comes if nothing kicks one sooner.
        self.next_pass_s = every_s
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
        """Where each wanted engine's installation stands, by engine name."""
        return [self._statuses[name].to_proto() for name in sorted(self._statuses)]

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
        else:
            self._failures = 0
            self.next_pass_s = self._every_s
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
        """Look for the binaries agent.yaml names; the only engines believed without installing."""
        found: dict[str, str] = {}
        for name, opts in self._cfg.engines.items():
            if opts.binary:
                if await asyncio.to_thread(_runnable, opts.binary):
                    found[name] = UNKNOWN_VERSION
                else:
                    log.warning(
                        "agent.yaml names an engine binary that is not there", engine=name, binary=opts.binary
                    )
        changed = found != self._configured or not self._probed
        self._configured, self._probed = found, True
        if changed:
            self._notify()

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


def _runnable(binary: str) -> bool:
    if os.sep in binary:
        return os.path.isfile(binary) and os.access(binary, os.X_OK)
    return shutil.which(binary) is not None
