"""An agent upgrading itself: fetch the release, check its digest, install it beside, restart into it.

The release is a wheel (from the mirror, a bundle's wheelhouse, a path on the node, or the package
index the node's pip uses) whose sha256 the control plane holds: one that does not match is refused
with nothing changed. It is installed into `<state_dir>/versions/<V>/`, a virtual environment of its
own beside the running one, which sees the running environment's packages beneath its own:
dependencies already there are not fetched again, and those the release needs anew come from the
wheelhouse (`find_links`), and from the package index when the release came from one.

Then the agent stops its roles, leaving its engines running, and execs into the new interpreter
(agent/trial.py): the same pid, the engines adopted, the new agent on trial until it registers.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import site
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import attrs
import structlog

import llmgw
from llmgw import durable, launcher
from llmgw.agent import trial
from llmgw.backoff import ExponentialBackoff
from llmgw.download import DownloadError, Retries, fetch
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# How long the new agent has to register when the control plane does not say.
DEFAULT_TRIAL_S = 60
# Making the environment and installing one wheel into it: seconds, unless pip must fetch.
_INSTALL_TIMEOUT_S = 600.0


class UpgradeRefused(Exception):
    """Why a release is not installed, in words for a person; nothing was changed."""


class Upgrader:
    """Carries out the control plane's Upgrade orders, and this agent's own trial after one.

    run() is the owned task; ask() hands it an order. status() is what the node reports;
    `changed` is set whenever it would answer differently. Once a restart is decided,
    `restart` says into what and `restart_wanted` is set: the role's owner stops the roles
    and execs (cli/serve.py).
    """

    def __init__(
        self,
        state_dir: Path,
        marker: trial.Marker | None,
        *,
        on_trial: bool,
        leave_engines: Callable[[], None],
        version: str = llmgw.__version__,
    ) -> None:
        """marker, on_trial: what trial.settle found as this agent started."""
        self._state_dir = state_dir
        self._leave_engines = leave_engines
        self._version = version
        self._orders: asyncio.Queue[pb.Upgrade] = asyncio.Queue()
        self._on_trial = on_trial
        self._marker = marker
        self._status: pb.UpgradeStatus | None = marker.status() if marker is not None else None
        self.changed = asyncio.Event()
        self.restart: trial.Restart | None = None
        self.restart_wanted = asyncio.Event()

    def status(self) -> pb.UpgradeStatus | None:
        return self._status

    def ask(self, order: pb.Upgrade) -> None:
        self._orders.put_nowait(order)

    async def run(self, connected: asyncio.Event) -> None:
        """Hold the trial, when this agent is on one, then carry out orders until cancelled."""
        if self._on_trial and self._marker is not None:
            await self._hold_trial(self._marker, connected)
        while self.restart is None:
            order = await self._orders.get()
            try:
                await self._upgrade(order)
            except OSError as exc:
                # A full disk or a read-only state_dir costs the node this upgrade, never its agent.
                log.exception("could not upgrade", version=order.version)
                why = f"cannot upgrade: {exc.strerror or exc} ({exc.filename or 'no file'})"
                await self._refused(order, why)

    async def _hold_trial(self, marker: trial.Marker, connected: asyncio.Event) -> None:
        bound = marker.trial_s
        try:
            async with asyncio.timeout(bound):
                await connected.wait()
        except TimeoutError:
            why = f"the agent of {marker.to} did not register with the control plane within {bound:g} s"
            log.error("going back to the previous agent", why=why)
            back = trial.back_to_previous(marker)
            await asyncio.to_thread(
                trial.write, self._state_dir, attrs.evolve(marker, state=trial.ROLLED_BACK, detail=why)
            )
            self._restart_into(back)
            return
        took = trial.started_ago(marker)
        done = attrs.evolve(
            marker, state=trial.UPGRADED, detail=f"upgraded from {marker.from_version} in {took:.1f} s"
        )
        await asyncio.to_thread(_commit, self._state_dir, done)
        log.info("upgraded: this agent registered, and stays", version=marker.to, took_s=round(took, 1))
        self._report(done.status())

    async def _upgrade(self, order: pb.Upgrade) -> None:
        if order.version == self._version:
            self._report(_status(order, trial.UPGRADED, f"already runs {self._version}", self._version))
            return
        source = order.url or f"llmgw {order.version} from {order.index_url or 'the package index'}"
        self._report(_status(order, "installing", f"fetching {source}", self._version))
        try:
            python = await self._install(order)
        except UpgradeRefused as exc:
            log.warning("refused an upgrade", version=order.version, why=str(exc))
            await self._refused(order, str(exc))
            return
        # The bootstrap written before the marker: a marker on trial with no way to run the trial
        # would read, at the next start, as a new agent that stopped before it registered.
        restart = await asyncio.to_thread(trial.into, python, self._state_dir)
        previous, pythonpath = trial.previous_command()
        marker = trial.Marker(
            to=order.version,
            from_version=self._version,
            state=trial.TRIAL,
            trial_s=float(order.trial_s or DEFAULT_TRIAL_S),
            previous=previous,
            previous_pythonpath=pythonpath,
            started=time.time(),
        )
        await asyncio.to_thread(trial.write, self._state_dir, marker)
        self._report(_status(order, "restarting", f"restarting into {python.parent.parent}", self._version))
        self._restart_into(restart)

    async def _refused(self, order: pb.Upgrade, why: str) -> None:
        """Say the node refused order, and keep it in the marker: said again after a restart of the agent.

        Held only in memory, a refusal (a digest that did not match) vanished from `ctl nodes` at
        the agent's next start, while docs/operations.md says it stays until the node's next upgrade.
        """
        marker = trial.Marker(to=order.version, from_version=self._version, state=trial.REFUSED, detail=why)
        try:
            await asyncio.to_thread(trial.write, self._state_dir, marker)
        except OSError as exc:
            log.warning("could not keep the refusal in the upgrade marker", error=str(exc))
        # Said once kept: a refusal reported and then lost to a restart in between would not be said again.
        self._report(marker.status())

    def _restart_into(self, restart: trial.Restart) -> None:
        # The engines outlive this process image whatever keep_engines_on_stop says: the point.
        self._leave_engines()
        self.restart = restart
        self.restart_wanted.set()

    async def _install(self, order: pb.Upgrade) -> Path:
        """The new environment's interpreter, order.version installed and checked; else UpgradeRefused."""
        versions = self._state_dir / "versions"
        incoming = versions / "incoming"
        await asyncio.to_thread(shutil.rmtree, incoming, True)
        try:
            if order.url:
                wheel = await self._fetch(order, incoming)
            else:
                wheel = await _download(order, incoming)
            digest = await asyncio.to_thread(_sha256, wheel)
            if digest != order.sha256.strip().lower():
                raise UpgradeRefused(
                    f"{wheel.name} has sha256 {digest}, not the {order.sha256} the control plane holds "
                    f"for {order.version}: refused, nothing changed"
                )
            return await _make_environment(versions / order.version, wheel, order)
        finally:
            # Whatever the outcome, nothing fetched stays: a refused release leaves the node as it was.
            await asyncio.to_thread(shutil.rmtree, incoming, True)

    async def _fetch(self, order: pb.Upgrade, incoming: Path) -> Path:
        """The wheel at order.url, copied into incoming; its digest is checked by the caller."""
        name: str = order.url.rstrip("/").rsplit("/", 1)[-1]
        if not name.endswith(".whl"):
            raise UpgradeRefused(f"{order.url} is not a wheel (a .whl file)")
        await asyncio.to_thread(incoming.mkdir, parents=True)
        target: Path = incoming / name
        if order.url.startswith(("http://", "https://")):
            retries = Retries(3, ExponentialBackoff(base_s=1.0, cap_s=10.0, jitter=0.5))
            try:
                async with aiohttp.ClientSession() as session:
                    await fetch(session, order.url, target.with_suffix(".part"), retries=retries)
            except DownloadError as exc:
                raise UpgradeRefused(f"cannot fetch {order.url}: {exc}") from None
            await asyncio.to_thread(durable.move_into_place, target.with_suffix(".part"), target)
        else:
            source = Path(order.url.removeprefix("file://"))
            try:
                await asyncio.to_thread(shutil.copyfile, source, target)
            except OSError as exc:
                raise UpgradeRefused(f"cannot read {source}: {exc.strerror or exc}") from None
        return target

    def _report(self, status: pb.UpgradeStatus) -> None:
        self._status = status
        self.changed.set()


async def _download(order: pb.Upgrade, incoming: Path) -> Path:
    """llmgw order.version's wheel from the package index into incoming, as this node's pip finds it."""
    await asyncio.to_thread(incoming.mkdir, parents=True)
    argv = [sys.executable, "-m", "pip", "download", f"llmgw=={order.version}", "--no-deps"]
    argv += ["--only-binary", ":all:", "--no-input", "--disable-pip-version-check", "--progress-bar", "off"]
    argv += [*_index(order), "-d", str(incoming)]
    got = await launcher.run(argv, env=_ENV, timeout_s=_INSTALL_TIMEOUT_S)
    if not got.ok:
        raise UpgradeRefused(not_downloaded(order.version, got))
    wheels = await asyncio.to_thread(lambda: sorted(incoming.glob("llmgw-*.whl")))
    if len(wheels) != 1:
        raise UpgradeRefused(
            f"the package index has no wheel of llmgw {order.version} (pip download left {len(wheels)})"
        )
    return wheels[0]


def not_downloaded(version: str, got: launcher.CommandResult) -> str:
    """Why pip download found no llmgw version, in words: pip's last line, or the index it ignored."""
    if got.timed_out:
        return (
            f"cannot fetch llmgw {version}: pip download did not finish within {_INSTALL_TIMEOUT_S:g} s "
            f"(it last said: {got.last_line() or 'nothing'})"
        )
    for line in got.output.splitlines():
        # pip skips an index served over http on another machine with a warning, then says only
        # that no version matched: the operator would look for a missing release, not a setting.
        ignored = _IGNORED.search(line)
        if ignored is not None:
            host = ignored.group(1)
            return (
                f"cannot fetch llmgw {version}: pip ignores the package index at {host}, served over "
                f"http: trust it in the node's pip configuration (pip config set global.trusted-host "
                f"{host}), or serve it over https"
            )
    return f"the package index has no llmgw {version}: {got.last_line()}"


_IGNORED = re.compile(r"The repository located at (\S+) is not a trusted or secure host")


def _index(order: pb.Upgrade) -> list[str]:
    """pip's options for where packages come from: the order's index, the node's own, or none at all."""
    if order.url:
        # The release came from the mirror or a bundle: a node of an offline site asks no registry.
        return ["--no-index"]
    return ["--index-url", order.index_url] if order.index_url else []


# Without PYTHONPATH: the new environment is judged as it will run, not with the running sources
# first on its path (a checkout's llmgw.egg-info there said the wheel installed the old version).
# (The launcher adds env to this process's own; Python reads an empty PYTHONPATH as none.)
_ENV = {"PYTHONPATH": ""}


async def _make_environment(target: Path, wheel: Path, order: pb.Upgrade) -> Path:
    """A virtual environment at target with wheel installed; its interpreter. Else UpgradeRefused."""
    part = target.with_name(f"{target.name}.part")
    await asyncio.to_thread(shutil.rmtree, part, True)
    try:
        await _install_into(part, wheel, order)
    except BaseException:
        # A half-made environment is of no use to the next try, and only fills the disk.
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, part, True))
        raise
    await asyncio.to_thread(shutil.rmtree, target, True)
    # Synced, every file of it: a power loss must not leave `current` naming an environment of empty files.
    await asyncio.to_thread(durable.move_into_place, part, target)
    return target / "bin" / "python"


async def _install_into(part: Path, wheel: Path, order: pb.Upgrade) -> None:
    """Make the environment at part and install wheel into it, its version checked; else UpgradeRefused."""
    env = _ENV
    made = await launcher.run(
        [sys.executable, "-m", "venv", "--without-pip", str(part)], env=env, timeout_s=120
    )
    if not made.ok:
        raise UpgradeRefused(f"cannot make an environment at {part}: {made.last_line()}")
    python = part / "bin" / "python"
    inherited = await launcher.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], env=env, timeout_s=60
    )
    # Beneath its own packages: the new llmgw is found first, the dependencies already here after.
    await asyncio.to_thread(Path(inherited.output.strip(), "_llmgw_running.pth").write_text, _running_paths())
    links = ["--find-links", str(wheel.parent)]
    if order.find_links:
        links += ["--find-links", order.find_links]
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input"]
    argv += ["--disable-pip-version-check", *_index(order), *links, str(wheel)]
    installed = await launcher.run(argv, env=env, timeout_s=_INSTALL_TIMEOUT_S)
    if not installed.ok:
        raise UpgradeRefused(f"cannot install {wheel.name}: {installed.last_line()}")
    said = await launcher.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('llmgw'))"],
        env=env,
        timeout_s=60,
    )
    if said.output.strip() != order.version:
        raise UpgradeRefused(f"{wheel.name} installs llmgw {said.output.strip()!r}, not {order.version}")


def _running_paths() -> str:
    """The running environment's package directories, one a line, for the new environment's .pth."""
    here = [p for p in (*site.getsitepackages(), *sys.path) if p.endswith(("site-packages", "dist-packages"))]
    return "".join(f"{p}\n" for p in dict.fromkeys(here))


def _commit(state_dir: Path, marker: trial.Marker) -> None:
    """Record the upgrade, and point `versions/current` at it for a unit that runs that path."""
    trial.write(state_dir, marker)
    current = state_dir / "versions" / "current"
    current.parent.mkdir(parents=True, exist_ok=True)
    link = current.with_name("current.part")
    link.unlink(missing_ok=True)
    link.symlink_to(marker.to)
    durable.move_into_place(link, current)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _status(order: pb.Upgrade, state: str, detail: str, from_version: str) -> pb.UpgradeStatus:
    return pb.UpgradeStatus(version=order.version, state=state, detail=detail, from_version=from_version)
