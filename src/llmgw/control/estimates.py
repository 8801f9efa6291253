"""What one replica of each catalog model needs, by its files' headers, read once per definition.

Placement runs every reconcile pass and must never read a file or the
network; so the reconciler refreshes this cache at the start of a pass, and
only a model whose definition changed (added, replaced) is read again. A
profile that states `min_memory_mb` keeps it; for one that does not, the
estimate (llmgw/capacity/: the same one `llmgw ctl model plan` prints) is what
a replica needs: per card on GPUs, split over gpus_per_node × nodes, else in
RAM. A model whose headers cannot be read is placed as before, and the log
says why once per definition.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import attrs
import structlog

from llmgw.capacity.estimate import MIB, estimate, gigabytes, loads_weights
from llmgw.capacity.fit import cards_needed
from llmgw.capacity.fleet import ProfileShape
from llmgw.capacity.ggufmeta import HeaderError
from llmgw.capacity.plan import DEFAULT_CONTEXT, sequences
from llmgw.capacity.shape import ModelShape, read_shape
from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control.remoteheaders import fetch_headers
from llmgw.errors import LlmgwError
from llmgw.hubref import SOURCE_PREFIX
from llmgw.localsource import local_path

log = structlog.get_logger(__name__)

# A mirror: source -> its URL and pins (control/mirror.py's MirrorClient.resolve).
Resolve = Callable[[str], Awaitable[tuple[str, dict[str, str]]]]


@attrs.frozen
class Need:
    """One replica's estimated memory: on `cards` cards (0: in RAM), `share_mb` on each, or in RAM."""

    total_bytes: int
    cards: int
    share_mb: int

    def words(self) -> str:
        """ "about 4.3 GB per card (estimated from the model's headers)"."""
        where = " per card" if self.cards else ""
        return f"about {gigabytes(self.share_mb * MIB)}{where} (estimated from the model's headers)"


# (model, profile) -> its need; a profile absent has none estimated (min_memory_mb says, or nothing).
Needs = Mapping[tuple[str, str], Need]


def need_of(shape: ModelShape, profile: ProfileConfig) -> Need | None:
    """profile's replica's need by shape, as `ctl model plan` judges it; None for a weightless engine."""
    ps = ProfileShape(
        name=profile.name,
        engine=profile.engine,
        gpu_class=profile.gpu_class,
        gpus_per_node=profile.gpus_per_node,
        nodes=profile.nodes,
        min_memory_mb=profile.min_memory_mb,
        args=list(profile.args),
    )
    context, parallel = sequences(ps)
    est = estimate(
        shape,
        profile.engine,
        context=context or shape.context_length or DEFAULT_CONTEXT,
        parallel=parallel or 1,
        args=profile.args,
        env=profile.env,
        on_gpu=cards_needed(ps) > 0,
    )
    if est.total_bytes <= 0:
        return None
    cards = cards_needed(ps) * max(profile.nodes, 1)
    share = math.ceil(est.total_bytes / cards) if cards else est.total_bytes
    return Need(total_bytes=est.total_bytes, cards=cards, share_mb=math.ceil(share / MIB))


class Estimates:
    """The needs of the catalog's models, kept per model definition."""

    def __init__(self, resolve: Resolve | None = None, timeout_s: float = 10.0) -> None:
        """resolve turns a mirror: source into its URL; timeout_s bounds reading one model's headers."""
        self._resolve = resolve
        self._timeout_s = timeout_s
        # name -> the definition its needs were read for (equal definitions are not read again).
        self._seen: dict[str, ModelConfig] = {}
        self._needs: dict[tuple[str, str], Need] = {}

    def needs(self) -> Needs:
        return self._needs

    async def refresh(self, models: Sequence[ModelConfig]) -> None:
        """Read the headers of every model whose definition is new since the last refresh."""
        names = {m.name for m in models}
        for gone in [n for n in self._seen if n not in names]:
            self._forget(gone)
        for model in models:
            if self._seen.get(model.name) == model:
                continue
            self._forget(model.name)
            self._seen[model.name] = model
            # Nothing to read for a profile that states its need, or an engine that loads no weights.
            if not model.source or all(
                p.min_memory_mb > 0 or not loads_weights(p.engine) for p in model.profiles
            ):
                continue
            try:
                shape = await remote_shape(model.source, self._resolve, self._timeout_s)
            except LlmgwError as exc:
                log.warning("placing without a memory estimate", model=model.name, reason=str(exc))
                continue
            for profile in model.profiles:
                need = need_of(shape, profile) if profile.min_memory_mb <= 0 else None
                if need is not None:
                    self._needs[(model.name, profile.name)] = need

    def _forget(self, name: str) -> None:
        self._seen.pop(name, None)
        for key in [k for k in self._needs if k[0] == name]:
            del self._needs[key]


async def remote_shape(source: str, resolve: Resolve | None, timeout_s: float) -> ModelShape:
    """The shape of the model at source (an http(s) URL, mirror:REPO@REV through resolve, a local path).

    Placement's estimates and `GET /api/v1/capacity` both read a model's headers
    here, so `ctl model plan` judges the shape placement does. LlmgwError in words
    when they cannot be read, in timeout_s or at all.
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_shape(source, resolve)
    except TimeoutError:
        raise LlmgwError(f"reading {source}'s headers took over {timeout_s:.0f} s") from None


async def _read_shape(source: str, resolve: Resolve | None) -> ModelShape:
    path = local_path(source)
    if path is not None:
        # A catalog model's files on this machine's disk (llmgw/localsource.py): read where they are.
        return await asyncio.to_thread(read_shape, path)
    url = source
    if source.startswith(SOURCE_PREFIX):
        if resolve is None:
            raise LlmgwError(f"{source}: no mirror is configured to read its headers from")
        url, _ = await resolve(source)
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="llmgw-headers-"))
    # The headers are laid out under tmp as the files are under base: tmp is gone when the plan is
    # read, so the shape and any refusal name the model as its source and its files by their URLs.
    base = url if url.endswith("/") else url.rsplit("/", 1)[0] + "/"
    try:
        shape = await asyncio.to_thread(read_shape, await fetch_headers(url, tmp))
    except HeaderError as exc:
        raise HeaderError(str(exc).replace(f"{tmp}/", base).replace(str(tmp), url)) from None
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)
    files = tuple(attrs.evolve(f, path=f.path.replace(f"{tmp}/", base, 1)) for f in shape.files)
    return attrs.evolve(shape, source=source, files=files)
