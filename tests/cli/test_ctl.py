"""`llmgw ctl` against a real admin API on loopback; its tables match golden files in tests/cli/golden/."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.adminapi import auth
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.scaling import SCALER_KEY
from llmgw.agent.discovery.host import Host
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.cli.exit import EXIT_CONFIG, EXIT_DENIED, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_USAGE
from llmgw.config import ModelConfig, ProfileConfig, ScaleConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.placement import Backoff
from llmgw.control.scaling import ColdStart, Scaler
from llmgw.proto.llmgw import v1 as pb

GOLDEN = Path(__file__).parent / "golden"
# LLMGW_UPDATE_GOLDEN=1 rewrites the golden files from what ctl prints now; review the diff.
UPDATE = os.environ.get("LLMGW_UPDATE_GOLDEN") == "1"
CFG = ServerConfig(
    models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
    admin_tokens=[auth.hash_token("s3cret")],
)


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"ctl's output differs from {path}"


# The secret gpu-01's replica requires of its callers: no command ever prints it.
ENGINE_SECRET = "engine-secret-that-must-stay-hidden"


def fleet() -> Inventory:
    """Two nodes as they would register: one busy H100 node with a sick GPU, one that said nothing yet."""
    inventory = Inventory(5.0, clock=lambda: 1000.0)
    inventory.attach(
        pb.Register(
            node_id="gpu-01",
            agent_version="0.11.2",
            engine_versions={"sim": "builtin", "llamacpp": "b4000"},
            engines_probed=True,
            gpus=[
                pb.Gpu(index=0, name="NVIDIA H100", gpu_class="h100-80g", healthy=True),
                pb.Gpu(
                    index=1,
                    name="NVIDIA H100",
                    gpu_class="h100-80g",
                    healthy=False,
                    unhealthy_reason="XID 79",
                ),
            ],
            memory=pb.Memory(total_mb=524288, available_mb=393216),
            running=[
                pb.ShardStatus(
                    shard_id="sim-chat-1a2b",
                    model="sim-chat",
                    engine="sim",
                    state="ready",
                    endpoint="http://x:1",
                    engine_secret=ENGINE_SECRET,
                )
            ],
        ),
        "10.0.0.1:50000",
    )
    inventory.attach(pb.Register(node_id="cpu-02"), "10.0.0.2:50000")
    inventory.attach(vm_register(), "10.0.0.3:50000")
    return inventory


# A VM left on QEMU's default CPU model, with a card passed through that has since failed, still
# downloading its llama.cpp build: what its agent would send, warnings from its own host discovery.
VM_HOST = Host(
    os_id="ubuntu",
    os_version="24.04",
    os_codename="noble",
    id_like=("debian",),
    arch="amd64",
    cpu_flags=("avx", "fma"),
    nvidia_driver="570.86.15",
)
DOWNLOADING = pb.ProvisionStatus(
    engine="llamacpp",
    version="b6500",
    state="installing",
    detail="downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)",
)


def vm_register() -> pb.Register:
    return pb.Register(
        node_id="vm-03",
        engine_versions={"sim": "builtin"},
        engines_probed=True,
        host=VM_HOST.to_proto(),
        warnings=VM_HOST.warnings(),
        provision=[DOWNLOADING],
        gpus=[
            pb.Gpu(index=0, name="NVIDIA L4", gpu_class="l4-24g", healthy=False, unhealthy_reason="no answer")
        ],
    )


async def answer_logs(inventory: Inventory, node_id: str) -> None:
    """The node's side, as its agent answers: agent lines, or an engine's, or an unknown source."""
    link = inventory._links[node_id]
    outputs = {
        "agent": [
            "2026-11-30 registered with the control plane",
            "2026-11-30 starting a shard <b>sim-chat</b>",
        ],
        "sim-chat-1a2b": ["listening on 127.0.0.1:40001"],
    }
    while True:
        request = (await link.outbox.get()).logs
        if not request.request_id:
            continue
        reply = pb.LogsReply(request_id=request.request_id, sources=list(outputs))
        if request.source in outputs:
            reply.lines = outputs[request.source][-request.lines :]
        else:
            reply.error = f"no engine {request.source} runs on this node"
        inventory.logs.resolve(node_id, reply)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Inventory]]:
    inventory = fleet()
    app = web.Application()
    catalog = Catalog(CFG)
    adminapi.install(app, CFG, inventory, catalog)
    # The same API as the client port serves it under /admin: an admin token required.
    guarded = web.Application()
    guard = auth.admin_token_or_session(CFG, _no_session)
    adminapi.install(guarded, CFG, inventory, catalog, prefix="/admin", guard=guard)
    app.add_subapp("/port", guarded)
    answering = asyncio.create_task(answer_logs(inventory, "gpu-01"))
    # The server's log lines kept out of the output CliRunner captures, which is this process's stdout.
    with capture_logs():
        async with TestServer(app) as test_server:
            yield str(test_server.make_url("")).rstrip("/"), inventory
    answering.cancel()


async def _no_session(request: web.Request) -> bool:
    return False


async def run(*args: str) -> tuple[int, str, str]:
    # In a thread: ctl runs its own event loop, and the server it talks to runs on this one.
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


class TestTables:
    async def test_nodes_prints_a_table_then_what_is_wrong_with_each_node(
        self, server: tuple[str, Inventory]
    ):
        code, out, err = await run("--server", server[0], "nodes")
        assert (code, err) == (0, "")
        golden("ctl_nodes.txt", out)

    async def test_an_install_a_warning_and_a_sick_gpu_each_get_a_line_until_they_are_resolved(
        self, server: tuple[str, Inventory]
    ):
        url, inventory = server
        _, out, _ = await run("--server", url, "nodes")
        assert out.endswith(
            "vm-03: llamacpp b6500 installing: downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)\n"
            'vm-03: no AVX2: inference runs several times slower (a VM needs CPU type "host")\n'
            "vm-03: GPU 0 (NVIDIA L4): no answer\n"
        )
        # The install finishes and the card is replaced: the node says so in a heartbeat.
        ready = pb.ProvisionStatus(
            engine="llamacpp", version="b6500", state="ready", detail="llama-server b6500"
        )
        inventory.heartbeat(
            "vm-03",
            pb.Heartbeat(
                provision_changed=True,
                provision=[ready],
                gpus_changed=True,
                gpus=[pb.Gpu(index=0, name="NVIDIA L4", gpu_class="l4-24g", healthy=True)],
            ),
        )
        _, out, _ = await run("--server", url, "nodes")
        assert "vm-03: llamacpp" not in out and "GPU 0 (NVIDIA L4)" not in out
        assert out.endswith(
            'vm-03: no AVX2: inference runs several times slower (a VM needs CPU type "host")\n'
        )

    async def test_nodes_json_carries_the_installs_the_os_and_the_warnings(
        self, server: tuple[str, Inventory]
    ):
        _, out, _ = await run("--server", server[0], "nodes", "--json")
        vm = next(n for n in json.loads(out) if n["id"] == "vm-03")
        install = {
            "engine": "llamacpp",
            "version": "b6500",
            "variant": "",
            "state": "installing",
            "detail": "downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)",
        }
        assert vm["provision"] == vm["installs_not_ready"] == [install]
        assert vm["host"] == {
            "os_id": "ubuntu",
            "os_version": "24.04",
            "os_codename": "noble",
            "family": "deb",
            "arch": "amd64",
            "cpu_flags": ["avx", "fma"],
            "nvidia_driver": "570.86.15",
        }
        assert vm["warnings"] == ['no AVX2: inference runs several times slower (a VM needs CPU type "host")']
        assert vm["unhealthy"] == ["GPU 0 (NVIDIA L4): no answer"]

    async def test_logs_prints_the_lines_then_on_stderr_the_other_sources(
        self, server: tuple[str, Inventory]
    ):
        code, out, err = await run("--server", server[0], "logs", "gpu-01", "-n", "5")
        assert code == 0
        golden("ctl_logs.stdout.txt", out)
        golden("ctl_logs.stderr.txt", err)

    async def test_models_lists_the_apis_each_model_serves(self, server: tuple[str, Inventory]):
        code, out, _ = await run("--server", server[0], "models")
        assert code == 0
        header, row = out.splitlines()[:2]
        assert "APIS" in header
        # The sim speaks every API of a chat model itself: nothing is translated.
        assert row.split()[3] == "chat,completions,messages,count_tokens,responses"
        code, out, _ = await run("--server", server[0], "models", "--json")
        (model,) = json.loads(out)
        assert (model["native_apis"], model["translated_apis"]) == (
            ["chat", "completions", "messages", "count_tokens", "responses"],
            [],
        )

    async def test_every_command_speaks_json_when_asked(self, server: tuple[str, Inventory]):
        for command in (["status"], ["nodes"], ["models"], ["replicas"], ["explain", "sim-chat"]):
            code, out, _ = await run("--server", server[0], *command, "--json")
            assert code == 0, command
            json.loads(out)
        code, out, _ = await run("--server", server[0], "--json", "logs", "gpu-01")
        assert json.loads(out)["lines"][-1] == "2026-11-30 starting a shard <b>sim-chat</b>"

    async def test_no_command_prints_a_replicas_engine_secret(self, server: tuple[str, Inventory]):
        assert server[1].engine_secret("sim-chat-1a2b") == ENGINE_SECRET
        for command in (["status"], ["nodes"], ["models"], ["replicas"], ["explain", "sim-chat"]):
            for json_flag in ([], ["--json"]):
                code, out, err = await run("--server", server[0], *json_flag, *command)
                assert code == 0, command
                assert ENGINE_SECRET not in out + err, command

    async def test_cordoning_a_node_says_what_it_means(self, server: tuple[str, Inventory]):
        code, out, _ = await run("--server", server[0], "node", "cordon", "cpu-02")
        assert (code, out) == (
            0,
            "cpu-02 is cordoned: no new replica goes there; what runs there keeps running\n",
        )
        node = server[1].node("cpu-02")
        assert node is not None and node.admin_state == "cordoned"
        code, out, _ = await run("--server", server[0], "node", "uncordon", "cpu-02")
        assert node.admin_state == "ready"


class TestExitCodes:
    async def test_an_unknown_source_exits_4_and_lists_the_sources_there_are(
        self, server: tuple[str, Inventory]
    ):
        code, out, err = await run("--server", server[0], "logs", "gpu-01", "--source", "gone")
        assert (code, out) == (EXIT_NOT_FOUND, "")
        assert err == (
            "llmgw ctl: no engine gone runs on this node\n"
            "-- gone on gpu-01; other sources: agent, sim-chat-1a2b\n"
        )

    async def test_a_node_that_is_not_connected_exits_1_saying_so(self, server: tuple[str, Inventory]):
        inventory = server[1]
        inventory.detach(inventory._links["cpu-02"])
        code, out, err = await run("--server", server[0], "logs", "cpu-02")
        assert (code, out) == (EXIT_ERROR, "")
        assert "node cpu-02 is not connected" in err

    async def test_draining_and_uncordoning_a_node_say_what_they_mean(self, server: tuple[str, Inventory]):
        code, out, _ = await run("--server", server[0], "node", "drain", "cpu-02")
        assert code == 0 and out.startswith("cpu-02 is draining")
        node = server[1].node("cpu-02")
        assert node is not None and node.admin_state == "draining"
        code, out, _ = await run("--server", server[0], "node", "uncordon", "cpu-02")
        assert (code, out) == (0, "cpu-02 is ready: replicas may be placed there again\n")
        assert node.admin_state == "ready"

    async def test_an_unknown_node_exits_4(self, server: tuple[str, Inventory]):
        code, _, err = await run("--server", server[0], "node", "drain", "nope")
        assert (code, err) == (EXIT_NOT_FOUND, "llmgw ctl: no node nope has registered\n")

    async def test_a_server_that_cannot_be_reached_exits_3(self, unused_tcp_port: int):
        code, _, err = await run("--server", f"http://127.0.0.1:{unused_tcp_port}", "status")
        assert code == EXIT_UNREACHABLE
        assert err.startswith(f"llmgw ctl: cannot reach the admin API at http://127.0.0.1:{unused_tcp_port}")

    async def test_a_wrong_token_exits_5_and_the_right_one_is_let_in(self, server: tuple[str, Inventory]):
        code, _, err = await run("--server", f"{server[0]}/port/admin", "--token", "guess", "status")
        assert code == EXIT_DENIED and "admin token" in err
        code, _, _ = await run("--server", f"{server[0]}/port/admin", "--token", "s3cret", "status")
        assert code == 0

    async def test_a_reply_of_another_shape_exits_1_naming_what_ctl_cannot_read(self):
        async def status(request: web.Request) -> web.Response:
            return web.json_response({"version": "0.1", "nodes": 3})

        app = web.Application()
        app.router.add_get("/api/v1/status", status)
        async with TestServer(app) as other:
            code, out, err = await run("--server", str(other.make_url("")).rstrip("/"), "status")
        assert (code, out) == (EXIT_ERROR, "")
        assert err == (
            "llmgw ctl: the admin API's reply is not one this ctl reads (invalid value for type, "
            "expected int @ $.nodes.total; invalid value for type, expected int @ $.nodes.ready; invalid "
            "value for type, expected int @ $.nodes.cordoned); is the server another llmgw version?\n"
        )

    async def test_a_line_count_out_of_range_is_a_usage_error(self, server: tuple[str, Inventory]):
        code, _, _ = await run("--server", server[0], "logs", "gpu-01", "-n", "5000")
        assert code == EXIT_USAGE

    async def test_without_server_it_talks_to_the_admin_listener_server_yaml_names(
        self, server: tuple[str, Inventory], tmp_path: Path
    ):
        """`llmgw ctl nodes` as docs/install.md runs it on the control plane: no --server, no token."""
        config_path = tmp_path / "server.yaml"
        config_path.write_text(f'admin_listen: "{server[0].removeprefix("http://")}"\n')
        code, out, _ = await run("--config", str(config_path), "nodes")
        assert code == 0 and "gpu-01" in out

    def test_without_server_it_reads_admin_listen_from_the_config_and_says_when_it_cannot(
        self, tmp_path: Path
    ):
        result = CliRunner().invoke(ctl, ["--config", str(tmp_path / "missing.yaml"), "status"])
        assert result.exit_code == EXIT_CONFIG
        assert "missing.yaml: cannot be read" in result.stderr

    def test_a_commands_help_needs_no_config(self, tmp_path: Path):
        result = CliRunner().invoke(ctl, ["--config", str(tmp_path / "missing.yaml"), "metrics", "--help"])
        assert (result.exit_code, result.stderr) == (0, "")
        assert "Usage: ctl metrics [OPTIONS] REPLICA" in result.stdout


def test_new_token_prints_the_token_and_the_digest_for_server_yaml():
    result = CliRunner().invoke(ctl, ["new-token"])
    token = result.stdout.strip()
    assert result.exit_code == 0 and token.startswith("llmgw-admin-")
    assert f"  - {auth.hash_token(token)}" in result.stderr


class TestMetrics:
    async def test_metrics_prints_the_replicas_engine_samples_one_a_line(self, server: tuple[str, Inventory]):
        url, inventory = server

        async def page(request: web.Request) -> web.Response:
            return web.Response(
                text="# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 14\n"
            )

        engine = web.Application()
        engine.router.add_get("/metrics", page)
        async with TestServer(engine, host="127.0.0.1") as answering:
            endpoint = str(answering.make_url("")).rstrip("/")
            inventory.shard_status(
                "gpu-01",
                pb.ShardStatus(
                    shard_id="tiny-1", model="tiny", engine="llamacpp", state="ready", endpoint=endpoint
                ),
            )
            code, out, err = await run("--server", url, "metrics", "tiny-1")
        assert (code, out, err) == (0, "llamacpp:prompt_tokens_total 14\n", "")

    async def test_metrics_of_a_replica_that_is_not_there_exits_4(self, server: tuple[str, Inventory]):
        code, _, err = await run("--server", server[0], "metrics", "nope")
        assert (code, err) == (
            EXIT_NOT_FOUND,
            "llmgw ctl: there is no replica nope; `llmgw ctl replicas` lists them\n",
        )


def test_the_cluster_page_and_ctl_show_a_node_through_one_presenter():
    from llmgw.adminapi import present
    from llmgw.cli import ctl as ctl_module
    from llmgw.web import cluster

    assert cluster.node_row is ctl_module.node_row is present.node_row


FAILURE_CAUSE = (
    "llamacpp exited with code 1: llama_model_load: error loading model: error: failed to load model"
)
NOT_OURS = "certificate not signed by this control plane's authority"


def _fail_and_forget(inventory: Inventory, model: str = "sim-chat") -> None:
    """A replica of model fails on gpu-01, and is stopped as the reconciler stops it."""
    inventory.shard_status(
        "gpu-01",
        pb.ShardStatus(
            shard_id=f"{model}-dead",
            model=model,
            engine="llamacpp",
            state="failed",
            detail=FAILURE_CAUSE,
            last_output=["main: exiting due to model loading error"],
        ),
    )
    inventory.forget(f"{model}-dead")


class TestFailuresAndRefusals:
    """Why replicas failed and who was refused: replicas --all, explain, status."""

    async def test_replicas_all_lists_a_replica_that_failed_and_is_gone_with_why(
        self, server: tuple[str, Inventory]
    ):
        url, inventory = server
        _fail_and_forget(inventory)
        code, out, _ = await run("--server", url, "replicas")
        assert code == 0 and "sim-chat-dead" not in out
        code, out, _ = await run("--server", url, "replicas", "--all")
        assert code == 0
        [line] = [line for line in out.splitlines() if "sim-chat-dead" in line]
        assert line.split()[:5] == ["sim-chat-dead", "sim-chat", "gpu-01", "failed", "0"]
        assert line.endswith(FAILURE_CAUSE)

    async def test_replicas_all_combines_with_a_model(self, server: tuple[str, Inventory]):
        url, inventory = server
        _fail_and_forget(inventory)
        code, out, _ = await run("--server", url, "replicas", "--all", "--model", "sim-chat")
        assert code == 0 and "sim-chat-dead" in out
        code, out, _ = await run("--server", url, "replicas", "--all", "--model", "other")
        assert code == 0 and "sim-chat-dead" not in out

    async def test_explain_lists_the_models_recent_failures_with_their_node_and_cause(
        self,
        server: tuple[str, Inventory],
    ):
        url, inventory = server
        _fail_and_forget(inventory)
        code, out, _ = await run("--server", url, "explain", "sim-chat")
        assert code == 0
        assert f"failed lately:\n  gpu-01, 0 s ago: {FAILURE_CAUSE}\n" in out

    async def test_status_lists_the_refused_connections_of_the_last_hour(self, server: tuple[str, Inventory]):
        url, inventory = server
        for port in (40001, 40002, 40003):
            inventory.refused.refuse(f"198.18.0.7:{port}", NOT_OURS)
        code, out, _ = await run("--server", url, "status")
        assert code == 0
        assert f"\n3 refused connections from 198.18.0.7 in the last hour: {NOT_OURS}\n" in out

    async def test_status_without_refusals_says_nothing_of_them(self, server: tuple[str, Inventory]):
        code, out, _ = await run("--server", server[0], "status")
        assert code == 0 and "refused" not in out


# Beside sim-chat, serving: two models that keep failing, one no node can take, one set to none.
CROWDED = attrs.evolve(
    CFG,
    models=[
        *CFG.models,
        *(
            ModelConfig(name=name, replicas=replicas, profiles=[ProfileConfig(engine="llamacpp")])
            for name, replicas in (("crashy", 1), ("huge", 1), ("crashy-2", 1), ("idle", 0))
        ),
    ],
)


@pytest.fixture
async def crowded() -> AsyncIterator[tuple[str, Inventory]]:
    inventory = fleet()
    for model in ("crashy", "crashy-2"):
        _fail_and_forget(inventory, model)
    app = web.Application()
    adminapi.install(app, CROWDED, inventory, Catalog(CROWDED))
    # crashy waits out its backoff on gpu-01, the one node that takes it; crashy-2's wait is over.
    backoff = {
        ("crashy", "gpu-01"): Backoff(failures=2, remaining_s=19.6, cause=FAILURE_CAUSE),
        ("crashy-2", "gpu-01"): Backoff(failures=1, remaining_s=-3.0, cause=FAILURE_CAUSE),
    }
    app[adminapi.BACKOFF_KEY] = lambda: backoff
    with capture_logs():
        async with TestServer(app) as test_server:
            yield str(test_server.make_url("")).rstrip("/"), inventory


class TestModelsWithoutReplicas:
    """`ctl replicas` lists replicas: a model with none had no row, and no hint that it exists."""

    async def test_replicas_says_beneath_the_table_how_many_models_have_none_and_why(
        self, crowded: tuple[str, Inventory]
    ):
        code, out, err = await run("--server", crowded[0], "replicas")
        assert (code, err) == (0, "")
        assert out.splitlines()[1].startswith("sim-chat-1a2b")
        assert out.endswith(
            "\n\n4 models have no replica now (1 failing, 1 backing off, 1 not placed, 1 set to 0 replicas): "
            "see `llmgw ctl replicas --all` or `llmgw ctl models`\n"
        )

    async def test_a_model_waiting_out_its_backoff_says_so_and_when_it_is_tried_again(
        self, crowded: tuple[str, Inventory]
    ):
        """A model failing on every node it fits had no replica while it waited, and read "failed lately"."""
        code, out, err = await run("--server", crowded[0], "replicas", "--model", "crashy")
        assert (code, err) == (0, "")
        assert out == (
            "1 model has no replica now (crashy: backing off, next try in 20 s): "
            "see `llmgw ctl replicas --all` or `llmgw ctl models`\n"
        )

    async def test_the_api_gives_each_node_a_model_backs_off_from_and_none_whose_wait_is_over(
        self, crowded: tuple[str, Inventory]
    ):
        code, out, _ = await run("--server", crowded[0], "models", "--json")
        assert code == 0
        backing_off = {m["name"]: m["backing_off"] for m in json.loads(out)}
        assert backing_off["crashy"] == [{"node": "gpu-01", "failures": 2, "next_try_s": 19.6}]
        assert backing_off["crashy-2"] == [] and backing_off["sim-chat"] == []

    async def test_replicas_of_a_model_with_none_says_why_instead_of_an_empty_table(
        self, crowded: tuple[str, Inventory]
    ):
        code, out, err = await run("--server", crowded[0], "replicas", "--model", "crashy-2")
        assert (code, err) == (0, "")
        assert out == (
            "1 model has no replica now (crashy-2: failing): "
            "see `llmgw ctl replicas --all` or `llmgw ctl models`\n"
        )

    async def test_replicas_all_lists_the_failed_and_counts_only_the_models_still_without_a_row(
        self, crowded: tuple[str, Inventory]
    ):
        code, out, _ = await run("--server", crowded[0], "replicas", "--all")
        assert code == 0 and "crashy-2-dead" in out
        assert out.endswith(
            "\n\n2 models have no replica now (1 not placed, 1 set to 0 replicas): see `llmgw ctl models`\n"
        )

    async def test_replicas_says_nothing_more_when_every_model_has_a_row(self, server: tuple[str, Inventory]):
        code, out, _ = await run("--server", server[0], "replicas")
        assert code == 0 and "no replica now" not in out and not out.endswith("\n\n")


def test_model_add_waits_for_a_server_hashing_a_local_source_longer_than_other_commands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The server hashes every byte of a local source before it answers: minutes, not the 15 s of a status."""
    import llmgw.cli.ctl as ctl_module

    asked: list[float] = []

    def exchange(*args: object, timeout_s: float = 15.0, **kwargs: object) -> tuple[int, object]:
        asked.append(timeout_s)
        return 400, {"error": "stop here"}

    monkeypatch.setattr(ctl_module, "_exchange", exchange)
    definition = tmp_path / "m.yaml"
    definition.write_text("name: m\nsource: /srv/m.gguf\nprofiles:\n  - engine: llamacpp\n")
    CliRunner().invoke(ctl, ["--server", "http://127.0.0.1:1", "model", "add", "-f", str(definition)])
    assert asked == [ctl_module._MODEL_ADD_S] and ctl_module._MODEL_ADD_S >= 600


class TestOnDemand:
    async def test_models_and_explain_say_an_on_demand_models_scale_its_reason_and_its_cold_start(self):
        model = ModelConfig(
            name="tiny-chat",
            profiles=[ProfileConfig(engine="sim")],
            scale=ScaleConfig(min=0, max=3, idle_s=600),
        )
        cfg = ServerConfig(models=[model])
        inventory, catalog = Inventory(5.0, clock=lambda: 1000.0), Catalog(cfg)
        scaler = Scaler({}, clock=lambda: 2000.0)
        scaler.wanted(model, {})
        state = scaler.state("tiny-chat")
        assert state is not None
        state.reason = "a request came for tiny-chat, which had no replica running"
        state.replicas = 1
        state.cold_start = ColdStart(total_s=2.4, place_s=0.01, weights_s=1.1, engine_s=1.29, node="n1")
        app = web.Application()
        adminapi.install(app, cfg, inventory, catalog)
        app[SCALER_KEY] = scaler
        with capture_logs():
            async with TestServer(app) as test_server:
                url = str(test_server.make_url("")).rstrip("/")
                code, out, _ = await run("--server", url, "models")
                assert code == 0
                said = (
                    "tiny-chat: 1 replica (min 0, max 3, idle 600 s): a request came for tiny-chat, which "
                    "had no replica running; now 0 in flight per ready replica (0 ready), target 8; expected "
                    "cold start 2.4 s, as the last on n1 (place 0.01 s, weights 1.1 s, engine start 1.29 s)"
                )
                assert said in out.splitlines()
                assert out.splitlines()[1].split()[:2] == ["tiny-chat", "0/1"]
                code, out, _ = await run("--server", url, "explain", "tiny-chat")
                assert code == 0 and f"\nscale: {said.removeprefix('tiny-chat: ')}\n" in out
