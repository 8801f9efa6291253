"""`llmgw ctl bench` against a sim engine behind a real gateway and admin API on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from llmgw.adminapi import bench as benchapi
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.routes import mount
from llmgw.bench.engineload import engine_load
from llmgw.bench.result import Level, Run
from llmgw.catalog import Catalog
from llmgw.cli.bench import _print as bench_table
from llmgw.cli.ctl import ctl
from llmgw.cli.exit import EXIT_ERROR, EXIT_USAGE
from llmgw.config import AuthConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import open_store
from llmgw.store.keys import create_key

MODEL = "sim-chat"
# No replica of its own: the gateway serves it with sim-chat's.
THROUGH_FALLBACK = "sim-alias"
CFG = ServerConfig(
    models=[
        ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")]),
        ModelConfig(
            name=THROUGH_FALLBACK, replicas=0, fallbacks=[MODEL], profiles=[ProfileConfig(engine="sim")]
        ),
        ModelConfig(name="lonely", replicas=0, profiles=[ProfileConfig(engine="sim")]),
    ],
    auth=AuthConfig(enabled=True),
)


@attrs.frozen
class Cluster:
    admin: str
    gateway: str
    key: str


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A sim replica a node reports ready, the gateway routing to it, and the admin API."""
    async with (
        TestServer(make_sim_app(MODEL), host="127.0.0.1", port=0) as sim,
        open_store(tmp_path / "llmgw.db") as store,
    ):
        inventory = Inventory(5.0)
        shard = pb.ShardStatus(
            shard_id="sim-chat-1a2b",
            model=MODEL,
            engine="sim",
            state="ready",
            endpoint=f"http://127.0.0.1:{sim.port}",
        )
        inventory.attach(
            pb.Register(node_id="n1", engine_versions={"sim": "builtin"}, running=[shard]), "127.0.0.1:1"
        )
        cfg = attrs.evolve(CFG, state_dir=str(tmp_path / "state"))
        catalog = Catalog(cfg)
        key, _ = await create_key(store, "bench")
        keys = KeyCache()
        await keys.refresh(store)
        admin_app = web.Application()
        adminapi.install(admin_app, cfg, inventory, catalog)
        mount(admin_app, benchapi.ROUTES)
        async with (
            TestServer(make_gateway_app(cfg, catalog, inventory, keys), host="127.0.0.1", port=0) as gateway,
            TestServer(admin_app, host="127.0.0.1", port=0) as admin,
        ):
            yield Cluster(
                admin=f"http://127.0.0.1:{admin.port}", gateway=f"http://127.0.0.1:{gateway.port}", key=key
            )


async def run(*args: str) -> tuple[int, str, str]:
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def bench_args(cluster: Cluster, *more: str) -> list[str]:
    return [
        "--server", cluster.admin, "bench", MODEL, "--gateway", cluster.gateway, "--key", cluster.key,
        "--seconds", "0.2", "--prompt-tokens", "8", "--max-tokens", "4", *more,
    ]  # fmt: skip


class TestBench:
    async def test_json_has_every_field_per_concurrency_with_requests_and_no_errors(self, cluster: Cluster):
        code, out, err = await run(*bench_args(cluster, "--concurrency", "1,3", "--json"))
        assert (code, err) == (0, "")
        data = json.loads(out)
        assert set(data) == {f.name for f in attrs.fields(Run)}
        assert (data["model"], data["prompt_tokens"], data["max_tokens"], data["engines"]) == (
            MODEL,
            8,
            4,
            ["sim"],
        )
        assert [level["concurrency"] for level in data["levels"]] == [1, 3]
        for level in data["levels"]:
            assert set(level) == {f.name for f in attrs.fields(Level)}
            assert level["requests"] > 0 and level["errors"] == 0 and level["error"] == ""
            # The engine's usage: the sim engine counts 8 words 8 tokens and stops at max_tokens.
            assert level["output_tokens"] == 4 * level["requests"]
            assert (level["input_tokens"], level["requests_without_usage"]) == (8 * level["requests"], 0)
            for figure in ("ttft", "tpot", "itl", "e2e"):
                assert all(level[f"{figure}_{p}_ms"] is not None for p in ("p50", "p95", "p99")), figure
            # The sim engine reports neither a queue nor a KV cache: absent, not zero.
            assert (level["queue_depth_max"], level["kv_cache_max"]) == (None, None)
            assert level["engine_readings"] >= 1

    async def test_a_level_whose_seconds_run_out_before_it_begins_still_sends_one_request_per_worker(
        self, cluster: Cluster
    ):
        """As on a busy machine, where a short level's seconds pass before its workers start."""
        code, out, err = await run(
            *bench_args(cluster, "--concurrency", "1,3", "--seconds", "1e-9", "--json")
        )
        assert (code, err) == (0, "")
        levels = json.loads(out)["levels"]
        assert [(level["requests"], level["errors"]) for level in levels] == [(1, 0), (3, 0)]

    async def test_the_table_says_not_reported_for_what_the_engine_lacks(self, cluster: Cluster):
        code, out, err = await run(*bench_args(cluster, "--concurrency", "2"))
        assert (code, err) == (0, "")
        # The sim engine counts a word a token: its usage says 8 of the 8 words.
        assert out.startswith(
            "sim-chat: 8-word prompts (8 input tokens each), max_tokens 4 (4 output tokens each), "
            "0.2 s per level (sim)\nlatencies in ms, p50/p95/p99; tokens as the engine counted them\n"
        )
        header, row = out.splitlines()[2:]
        assert header.split()[:7] == ["CONC", "REQS", "ERRS", "TTFT", "TPOT", "ITL", "E2E"]
        cells = row.split()
        requests = int(cells[1])
        assert cells[0] == "2" and cells[2] == "0"
        assert all(len(cell.split("/")) == 3 for cell in cells[3:7])
        assert (cells[7], cells[8]) == (str(8 * requests), str(4 * requests))
        assert row.endswith("not reported  not reported")

    async def test_a_refused_key_is_counted_as_errors_with_the_gateways_words(self, cluster: Cluster):
        args = bench_args(attrs.evolve(cluster, key="sk-wrong"), "--concurrency", "1", "--json")
        code, out, _ = await run(*args)
        (level,) = json.loads(out)["levels"]
        assert code == 0
        assert (level["requests"], level["ttft_p50_ms"]) == (0, None)
        assert level["errors"] > 0 and level["error"].startswith("HTTP 401: ")

    async def test_a_model_without_a_ready_replica_or_a_fallback_is_refused_in_the_gateways_words(
        self, cluster: Cluster
    ):
        args = [
            "--server",
            cluster.admin,
            "bench",
            "lonely",
            "--gateway",
            cluster.gateway,
            "--key",
            cluster.key,
        ]
        code, out, err = await run(*args)
        assert (code, out) == (EXIT_ERROR, "")
        assert err.startswith(
            "llmgw ctl: lonely has no ready replica to measure, nor a fallback that serves it; "
            "the gateway answered HTTP 503: "
        )
        assert err.endswith(" (`llmgw ctl explain lonely` says why)\n")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{cluster.admin}/api/v1/models/lonely/bench") as reply,
        ):
            assert await reply.json() == []

    async def test_a_model_served_through_its_fallback_is_measured_on_the_fallbacks_replicas(
        self, cluster: Cluster
    ):
        """It was refused as having no ready replica, though the gateway served every request of it."""
        args = bench_args(cluster, "--concurrency", "2", "--json")
        args[args.index(MODEL)] = THROUGH_FALLBACK
        code, out, err = await run(*args)
        assert (code, err) == (0, "")
        data = json.loads(out)
        assert (data["model"], data["served_by"], data["engines"]) == (THROUGH_FALLBACK, [MODEL], ["sim"])
        (level,) = data["levels"]
        assert level["requests"] > 0 and level["errors"] == 0
        assert level["engine_readings"] >= 1
        code, out, err = await run(*[a for a in args if a != "--json"])
        assert (code, err) == (0, "")
        assert out.splitlines()[0].endswith("0.2 s per level, served by its fallback sim-chat (sim)")

    async def test_a_concurrency_that_is_not_a_list_of_numbers_is_a_usage_error(self, cluster: Cluster):
        code, _, err = await run("--server", cluster.admin, "bench", MODEL, "--concurrency", "1,four")
        assert code == EXIT_USAGE and "is not a list of whole numbers such as 1,4,16" in err

    async def test_a_concurrency_in_other_digits_or_past_its_bound_is_a_usage_error(self, cluster: Cluster):
        """int() read "٤" as 4, and a billion requests in flight at once filled the memory."""
        for levels, said in (
            ("1,\u0664", "a concurrency is '\u0664'; write a whole number from 1 to 10,000"),
            ("1000000000", "a concurrency is 1000000000; it must be a whole number from 1 to 10,000"),
        ):
            code, _, err = await run("--server", cluster.admin, "bench", MODEL, "--concurrency", levels)
            assert code == EXIT_USAGE and said in err, err
        code, _, err = await run("--server", cluster.admin, "bench", MODEL, "--seconds", "nan")
        assert (
            code == EXIT_USAGE and "--seconds is 'nan'; write a number more than 0 and at most 86,400" in err
        )


class TestKept:
    async def test_a_run_is_kept_on_the_server_and_read_back_newest_first(self, cluster: Cluster):
        for levels in ("1", "2"):
            code, _, err = await run(*bench_args(cluster, "--concurrency", levels, "--json"))
            assert (code, err) == (0, "")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{cluster.admin}/api/v1/models/{MODEL}/bench") as reply,
        ):
            runs = await reply.json()
        assert [[level["concurrency"] for level in r["levels"]] for r in runs] == [[2], [1]]
        assert all(r["levels"][0]["requests"] > 0 for r in runs)

    async def test_no_keep_leaves_nothing_on_the_server(self, cluster: Cluster):
        code, _, _ = await run(*bench_args(cluster, "--concurrency", "1", "--no-keep"))
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{cluster.admin}/api/v1/models/{MODEL}/bench") as reply,
        ):
            assert (code, await reply.json()) == (0, [])

    async def test_a_run_of_another_model_or_an_unknown_model_is_refused(self, cluster: Cluster):
        _, out, _ = await run(*bench_args(cluster, "--concurrency", "1", "--no-keep", "--json"))
        kept = json.loads(out)
        async with aiohttp.ClientSession() as session:
            other = {**kept, "model": "other"}
            async with session.post(f"{cluster.admin}/api/v1/models/{MODEL}/bench", json=other) as reply:
                assert (reply.status, await reply.json()) == (
                    400,
                    {"error": "the run is of other, not sim-chat"},
                )
            async with session.post(f"{cluster.admin}/api/v1/models/other/bench", json=kept) as reply:
                assert reply.status == 404


class TestEngineLoad:
    def test_llama_cpp_names_its_queue_and_cache_its_own_way(self):
        load = engine_load({"llamacpp:requests_deferred": 3.0, "llamacpp:kv_cache_usage_ratio": 0.25})
        assert (load.queue_depth, load.kv_cache) == (3.0, 0.25)

    def test_vllm_queues_are_summed_over_labels_and_the_old_cache_name_is_read(self):
        load = engine_load(
            {
                'vllm:num_requests_waiting{model_name="a"}': 2.0,
                'vllm:num_requests_waiting{model_name="b"}': 1.0,
                'vllm:gpu_cache_usage_perc{model_name="a"}': 0.5,
            }
        )
        assert (load.queue_depth, load.kv_cache) == (3.0, 0.5)

    def test_an_engine_without_the_figures_reports_none_rather_than_zero(self):
        load = engine_load({"llmgw_sim_requests_in_flight": 4.0})
        assert (load.queue_depth, load.kv_cache) == (None, None)


class TestTable:
    def test_a_nearly_empty_kv_cache_reads_with_its_precision_not_as_zero(
        self, capsys: pytest.CaptureFixture[str]
    ):
        """A 1 GiB vLLM cache at 0.0006 read "0%"."""
        level = Level(
            concurrency=1, requests=2, errors=0, error="", seconds=1.0, output_tokens=8, ttft_p50_ms=10.0,
            ttft_p95_ms=12.0, itl_p50_ms=0.007, output_tokens_per_s=8.0, requests_per_s=2.0,
            queue_depth_max=0.0, kv_cache_max=0.0006, engine_readings=2, input_tokens=1300,
        )  # fmt: skip
        run = Run(model="tiny", started_at="2026-12-01T00:00:00+00:00", prompt_tokens=128, max_tokens=4,
                  seconds=1.0, levels=[level], engines=["vllm"])  # fmt: skip
        bench_table(run)
        out = capsys.readouterr().out
        assert out.splitlines()[0] == (
            "tiny: 128-word prompts (650 input tokens each), max_tokens 4 (4 output tokens each), "
            "1 s per level (vllm)"
        )
        row = out.splitlines()[-1].split()
        assert row[-1] == "0.06%" and row[-2] == "0"
        # Figures not measured (a run kept before TPOT) read "none", not zeros.
        assert row[3:7] == ["10.0/12.0/-", "none", "0.007/-/-", "none"]
