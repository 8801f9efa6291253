"""The one-line summary of why a model serves nothing leads with the cause, on all three surfaces.

The 503 a client gets, `llmgw ctl models` and the models page read one
sentence (control/summary.py, through Inventory.why_no_ready); each test
registers nodes on the real inventory with the words their agents report,
runs the real reconciler and reads the three surfaces over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import AsyncIterator, Callable

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw import config
from llmgw.adminapi import handlers as adminapi
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.config import AuthConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.pricing import unpriced_sentence
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store, open_store
from llmgw.store.quotas import Budget
from llmgw.store.scopes import Scope
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.context import WebContext

MODEL = "tiny"
LDD = "libllama-server-impl.so is not installed"
DOWNLOADING = "downloading llama-b1-bin-ubuntu-x64.tar.gz (12 of 16 MB)"


@attrs.define
class Fleet:
    """The control plane's side: nodes are registered on inventory, as the agent service does."""

    inventory: Inventory
    reconciler: Reconciler
    admin: str
    gateway: str
    # The inventory's clock: a test moves it to make a node silent past the grace.
    clock: list[float]

    async def ctl(self, *args: str) -> str:
        result = await asyncio.to_thread(
            CliRunner().invoke, ctl, ["--server", self.admin, *args], catch_exceptions=False
        )
        return result.stdout

    def register(self, node_id: str, engines: dict[str, str] | None = None, **fields: object) -> None:
        self.inventory.attach(
            pb.Register(
                node_id=node_id,
                engine_versions=engines or {},
                engines_probed=True,
                **fields,  # type: ignore[arg-type]
            )
        )

    async def surfaces(self) -> tuple[str, str, str]:
        """The 503's message, `ctl models` output and the models page, for MODEL."""
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.gateway}/v1/chat/completions", json=chat) as reply:
                assert reply.status == 503
                message = (await reply.json())["error"]["message"]
            async with session.get(f"{self.admin}/models") as reply:
                page = html.unescape(await reply.text())
        return message, await self.ctl("models"), page


@pytest.fixture
async def store(tmp_path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@pytest.fixture
def fleet_of(store: Store) -> Callable[[ModelConfig], contextlib.AbstractAsyncContextManager[Fleet]]:
    """A control plane serving model: its admin listener and gateway on loopback, no node yet."""

    @contextlib.asynccontextmanager
    async def make(model: ModelConfig) -> AsyncIterator[Fleet]:
        cfg = ServerConfig(
            admin_listen="127.0.0.1:0",
            auth=AuthConfig(enabled=False),
            models=[model],
            # Long: a node backing off stays so while the surfaces are read.
            control=config.evolve(ServerConfig().control, base_backoff_s=600),
        )
        clock = [1000.0]
        inventory = Inventory(grace_s=cfg.control.grace_s, clock=lambda: clock[0])
        catalog = Catalog(cfg)
        reconciler = Reconciler(cfg, inventory, catalog, in_flight={}, clock=lambda: 1000.0)
        pages = WebContext(cfg=cfg, store=store)
        admin_app = make_admin_app(cfg, inventory, catalog, pages)
        # A budget is set somewhere, and no price applies to the model.
        admin_app[adminapi.BUDGETS_KEY] = lambda: [Budget(Scope("org", 1), 10.0, "month")]
        with capture_logs():
            async with (
                TestServer(admin_app, host="127.0.0.1") as admin,
                TestServer(
                    make_gateway_app(cfg, catalog, inventory, KeyCache()), host="127.0.0.1"
                ) as gateway,
            ):
                yield Fleet(
                    inventory,
                    reconciler,
                    str(admin.make_url("")).rstrip("/"),
                    str(gateway.make_url("")).rstrip("/"),
                    clock,
                )

    return make


def said_everywhere(surfaces: tuple[str, str, str], sentence: str) -> None:
    message, ctl_models, page = surfaces
    assert message == f"{MODEL} has no ready replica: {sentence}", message
    assert f"{MODEL} has no ready replica: {sentence}" in ctl_models, ctl_models
    assert f"{MODEL} has no ready replica: {sentence}" in page


def install(state: str, detail: str, next_try_s: int | None = None) -> list[pb.ProvisionStatus]:
    return [
        pb.ProvisionStatus(engine="llamacpp", version="b1", state=state, detail=detail, next_try_s=next_try_s)
    ]


LABELLED = ModelConfig(name=MODEL, profiles=[ProfileConfig(engine="llamacpp", labels={"pool": "p-ldd"})])
ANYWHERE = ModelConfig(name=MODEL, profiles=[ProfileConfig(engine="llamacpp")])


class TestTheNodeThatCouldServe:
    async def test_its_failed_install_is_quoted_and_the_labels_are_not_blamed(self, fleet_of) -> None:
        async with fleet_of(LABELLED) as fleet:
            fleet.register("n-ldd", labels={"pool": "p-ldd"}, provision=install("failed", LDD))
            # Each other fault on a node of its own, none with the label.
            faults = {
                "n-sum": "the checksum of llama-b1-bin-ubuntu-x64.tar.gz is not the publisher's",
                "n-gone": "the release b1 of llamacpp does not exist",
                "n-429": "the release host is refusing requests (HTTP 429); trying again later",
                "n-arm": "no build of llamacpp b1 for riscv64",
                "n-lib": "libgomp.so.1 is not installed",
                "n-old": "libstdc++.so.6 is too old (needs GLIBCXX_3.4.30)",
            }
            for node_id, detail in faults.items():
                fleet.register(node_id, labels={"pool": "other"}, provision=install("failed", detail))
            fleet.register("n-slow", labels={"pool": "other"}, provision=install("installing", DOWNLOADING))
            fleet.register("n-ok", {"llamacpp": "b1"})
            await fleet.reconciler.reconcile()
            said_everywhere(
                await fleet.surfaces(),
                f"only n-ldd has pool=p-ldd, and llamacpp b1 failed to install there: {LDD}",
            )

    async def test_its_failed_install_says_when_it_is_tried_again(self, fleet_of) -> None:
        async with fleet_of(LABELLED) as fleet:
            fleet.register("n-ldd", labels={"pool": "p-ldd"}, provision=install("failed", LDD, 300))
            fleet.register("n-other", {"llamacpp": "b1"})
            # The agent counted from when it sent it; a minute has gone by since.
            fleet.clock[0] += 60
            await fleet.reconciler.reconcile()
            said_everywhere(
                await fleet.surfaces(),
                f"only n-ldd has pool=p-ldd, and llamacpp b1 failed to install there: {LDD} "
                "(next try in 4 min)",
            )

    async def test_an_install_elsewhere_is_not_where_the_model_is_going(self, fleet_of) -> None:
        async with fleet_of(LABELLED) as fleet:
            fleet.register("n-ldd", labels={"pool": "p-ldd"}, provision=install("installing", DOWNLOADING))
            fleet.register(
                "n-slow", provision=install("installing", "unpacking llama-b1-bin-ubuntu-x64.tar.gz")
            )
            await fleet.reconciler.reconcile()
            said_everywhere(
                await fleet.surfaces(),
                f"only n-ldd has pool=p-ldd, and llamacpp b1 is installing there: {DOWNLOADING}",
            )

    async def test_an_unreachable_node_the_labels_rule_out_is_not_named(self, fleet_of) -> None:
        async with fleet_of(LABELLED) as fleet:
            fleet.register("n-ldd", labels={"pool": "p-ldd"}, provision=install("failed", LDD))
            fleet.register("n-lost", {"llamacpp": "b1"})
            fleet.inventory._nodes["n-lost"].state = "unreachable"
            await fleet.reconciler.reconcile()
            message, _, _ = await fleet.surfaces()
            assert "n-lost" not in message


class TestTheCauseComesFirst:
    async def test_a_model_backing_off_where_the_engine_is_leads_with_why(self, fleet_of) -> None:
        cause = "llamacpp exited with code 1: error: failed to load model"
        async with fleet_of(ANYWHERE) as fleet:
            fleet.register("n1", {"llamacpp": "b1"})
            fleet.register("n-slow", provision=install("installing", DOWNLOADING))
            fleet.inventory.shard_status(
                "n1",
                pb.ShardStatus(shard_id="s1", model=MODEL, engine="llamacpp", state="failed", detail=cause),
            )
            await fleet.reconciler.reconcile()
            said_everywhere(
                await fleet.surfaces(),
                "no node can run it (node n1 is backing off after 1 failure (next try in 300 s): "
                f"{cause}, installing llamacpp b1 on n-slow: {DOWNLOADING})",
            )


class TestALostNodesReplica:
    async def test_reads_not_routed_wherever_its_state_is_shown(self, fleet_of) -> None:
        async with fleet_of(ANYWHERE) as fleet:
            fleet.register("n1", {"llamacpp": "b1"})
            fleet.inventory.shard_status(
                "n1",
                pb.ShardStatus(
                    shard_id="s1",
                    model=MODEL,
                    engine="llamacpp",
                    state="ready",
                    endpoint="http://127.0.0.1:9",
                ),
            )
            fleet.clock[0] += fleet.inventory.grace_s + 5
            assert fleet.inventory.expire() == ["n1"]
            # The gateway keeps serving from an engine whose agent is away until its own check of the
            # engine fails (control/engine_checks.py): here nothing listens at the endpoint.
            fleet.inventory.engine_gone("s1", "connection refused")
            said = f"ready (node unreachable for {fleet.inventory.grace_s + 5:.0f} s; not routed)"
            message, _, page = await fleet.surfaces()
            assert message == f"{MODEL} has no ready replica: ready on n1, which is unreachable"
            assert said in page
            assert said in await fleet.ctl("replicas")
            assert "replicas  0 of 1 ready" in await fleet.ctl("status")


class TestAReplicaStartingAfterAFailure:
    async def test_says_its_try_and_the_last_ones_words_wherever_its_state_is_shown(self, fleet_of) -> None:
        def shard(shard_id: str, state: str, detail: str = "") -> pb.ShardStatus:
            return pb.ShardStatus(
                shard_id=shard_id, model=MODEL, engine="llamacpp", state=state, detail=detail
            )

        async with fleet_of(ANYWHERE) as fleet:
            fleet.register("n-bin", {"llamacpp": "b1"})
            fleet.inventory.shard_status(
                "n-bin", shard("s1", "failed", "llamacpp did not answer /health within 30 s")
            )
            fleet.inventory.shard_status("n-bin", shard("s1", "stopped"))
            fleet.inventory.shard_status("n-bin", shard("s2", "starting"))
            fleet.clock[0] += 5
            retrying = "(try 2; the last did not answer /health within 30 s)"
            message, _, page = await fleet.surfaces()
            assert message == f"{MODEL} has no ready replica: starting on n-bin for 5 s {retrying}"
            assert f"starting {retrying}" in page
            assert f"starting {retrying}" in await fleet.ctl("replicas")

            # Once it served there, the next start is a first again.
            fleet.inventory.shard_status("n-bin", shard("s2", "ready"))
            fleet.inventory.shard_status("n-bin", shard("s2", "stopped"))
            fleet.inventory.shard_status("n-bin", shard("s3", "starting"))
            message, _, _ = await fleet.surfaces()
            assert message == f"{MODEL} has no ready replica: starting on n-bin for 0 s"


class TestAnUnpricedModelUnderABudget:
    async def test_is_flagged_in_the_ctl_models_table_and_on_the_models_page(self, fleet_of) -> None:
        async with fleet_of(ANYWHERE) as fleet:
            await fleet.reconciler.reconcile()
            _, ctl_models, page = await fleet.surfaces()
            assert f"{MODEL}: {unpriced_sentence([MODEL])}" in ctl_models
            assert unpriced_sentence([MODEL]) in page
