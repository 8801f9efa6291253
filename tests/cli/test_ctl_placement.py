"""`llmgw ctl explain` and `llmgw ctl weights collect` against a real admin API on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import betterproto
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.adminapi import handlers as adminapi
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.placement import Backoff
from llmgw.proto.llmgw import v1 as pb

USED = "https://models.example/tiny/q4_k_m.gguf"
OPEN = "https://models.example/old/q4_k_m.gguf"
STALE = "https://models.example/older/q8_0.gguf"
TINY = ModelConfig(
    name="tiny",
    source=USED,
    profiles=[ProfileConfig(name="gpu", engine="llamacpp", gpu_class="h100-80g", gpus_per_node=1)],
)
CFG = ServerConfig(models=[TINY])


def _h100(count: int) -> list[pb.Gpu]:
    return [pb.Gpu(index=i, gpu_class="h100-80g", healthy=True) for i in range(count)]


def fleet() -> Inventory:
    """Four nodes, each telling a different story for tiny's next replica."""
    inventory = Inventory(5.0, clock=lambda: 1000.0)

    def register(node_id: str, **fields: object) -> None:
        inventory.attach(
            pb.Register(
                node_id=node_id,
                engine_versions={"llamacpp": "b6500"},
                engines_probed=True,
                **fields,  # type: ignore[arg-type]
            )
        )

    register(
        "gpu-01",
        gpus=_h100(2),
        weights=[
            pb.Weights(source=USED),
            pb.Weights(source=OPEN, in_use=True),
            pb.Weights(source=STALE),
        ],
    )
    register("gpu-02", gpus=_h100(2))
    register("cpu-03")
    register("gpu-04", gpus=_h100(2))
    inventory.set_admin_state("gpu-04", "cordoned")
    return inventory


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Inventory]]:
    inventory = fleet()
    app = web.Application()
    adminapi.install(app, CFG, inventory, Catalog(CFG))
    # What the server role wires in from its reconciler: tiny failed twice on gpu-02 lately.
    app[adminapi.BACKOFF_KEY] = lambda: {("tiny", "gpu-02"): Backoff(failures=2, remaining_s=20.0)}
    with capture_logs():
        async with TestServer(app) as test_server:
            yield str(test_server.make_url("")).rstrip("/"), inventory


async def run(*args: str) -> tuple[int, str, str]:
    # In a thread: ctl runs its own event loop, and the server it talks to runs on this one.
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def test_explain_prints_every_node_with_its_reason_backoff_included(server: tuple[str, Inventory]):
    code, out, _ = await run("--server", server[0], "explain", "tiny")
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines()[1:] if line.strip() and line.startswith("gpu")}
    assert out.splitlines()[0].split() == ["PROFILE", "NODE", "CANDIDATE", "WHY"]
    assert set(rows) == {"cpu-03", "gpu-01", "gpu-02", "gpu-04"}
    assert rows["gpu-01"].split()[2:] == ["yes", "is", "a", "candidate"]
    assert rows["gpu-02"].endswith("no         is backing off after 2 failures (next try in 20 s)")
    assert rows["cpu-03"].endswith("no         has no h100-80g GPU (it has no GPU)")
    assert rows["gpu-04"].endswith("no         is cordoned")


async def test_explain_json_carries_the_backoff_reason(server: tuple[str, Inventory]):
    code, out, _ = await run("--server", server[0], "--json", "explain", "tiny")
    assert code == 0
    assert '"reason": "is backing off after 2 failures (next try in 20 s)"' in out


async def test_weights_collect_removes_only_what_no_model_uses_and_no_engine_has_open(
    server: tuple[str, Inventory],
):
    url, inventory = server
    code, out, _ = await run("--server", url, "weights", "collect")
    assert code == 0
    assert out == (
        "cpu-03: removing 0, keeping 0\n"
        "gpu-01: removing 1, keeping 2\n"
        f"  removing {STALE}\n"
        f"  keeping {USED} (a model in the catalog uses it)\n"
        f"  keeping {OPEN} (an engine on gpu-01 uses it)\n"
        "gpu-02: removing 0, keeping 0\n"
        "gpu-04: removing 0, keeping 0\n"
    )
    link = inventory._links["gpu-01"]
    sent = [betterproto.which_one_of(link.outbox.get_nowait(), "kind") for _ in range(link.outbox.qsize())]
    assert [(kind, value.sources) for kind, value in sent] == [("remove_weights", [STALE])]
