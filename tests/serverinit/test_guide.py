"""docs/install.md: every command it shows is run by a named test, and the model it adds loads."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
from click.testing import CliRunner

from llmgw import config
from llmgw.catalog import load_server_config
from llmgw.cli.keys import keys
from llmgw.config import ServerConfig
from llmgw.control.stream.provision import wanted_engines
from llmgw.roles.server import server_role
from llmgw.serverinit.controlplane import InitOptions, init_control_plane
from tests.deploy.podman import CONTAINERS_CONF

from .conftest import FakeSystem

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "install.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::([\w:]+)`")


def _blocks(kind: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(GUIDE.read_text()) if lang == kind]


def _commands() -> list[str]:
    """Each command in the page's shell blocks, continuation lines joined."""
    commands: list[str] = []
    for body in _blocks(""):
        for command in body.replace("\\\n", " ").splitlines():
            if command.strip():
                commands.append(re.sub(r"\s+", " ", command.strip()))
    return commands


# The page's commands, and the first word or two of them a row of its last table names.
_ROWS = {
    "python3 -m pip wheel --no-deps -w dist .": "`pip wheel --no-deps -w dist .`",
    "sudo python3 -m venv /opt/llmgw": "`python3 -m venv /opt/llmgw`",
    "sudo /opt/llmgw/bin/pip install dist/llmgw-*.whl": "`pip install dist/llmgw-*.whl`",
    "sudo ln -sfn /opt/llmgw/bin/llmgw /usr/local/bin/llmgw": "`ln -sfn …`",
    "sudo llmgw server init --admin you@example.com": "`llmgw server init --admin you@example.com`",
    "curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8080/health": "`curl …/health`",
    "sudo llmgw server init --host llmgw.example.com --host 203.0.113.10": "`llmgw server init --host …`",
    "sudo scripts/onboard-node.sh --node gpu-01 --addr 10.0.0.21 --server 10.0.0.140:7443 "
    "--wheel dist/llmgw-*.whl": ("`scripts/onboard-node.sh …`"),
    "sudo scripts/onboard-node.sh --node gpu-02 --addr 10.0.0.22 --server 10.0.0.140:7443 "
    "--wheelhouse wheels": "`scripts/onboard-node.sh … --wheelhouse wheels`",
    "llmgw ctl nodes": "`llmgw ctl nodes`",
    "sudo systemctl restart llmgw-server": "`systemctl restart llmgw-server`",
    "sudo -u llmgw llmgw keys create first": "`llmgw keys create first`",
    "sudo install -d -o llmgw /srv/models": "`install -d -o llmgw /srv/models`",
    "sudo cp qwen2.5-0.5b-instruct-q4_k_m.gguf /srv/models/": "`cp …gguf /srv/models/`",
    "sudo -u llmgw llmgw ctl model add -f qwen.yaml": "`llmgw ctl model add -f qwen.yaml`",
    'curl -s http://127.0.0.1:8080/v1/chat/completions -H "Authorization: Bearer $KEY" '
    '-H \'Content-Type: application/json\' -d \'{"model": "sim-chat", "messages": '
    '[{"role": "user", "content": "Hello"}]}\'': "`curl …/v1/chat/completions`",
    # The section on containers, at the end of the page.
    "sudo make image": "`make image`",
    "sudo podman network create llmgw": "`podman network create llmgw`",
    "sudo podman run -d --name llmgw-server --network llmgw -p 8080:8080 -v /etc/llmgw:/etc/llmgw:ro "
    "-v /var/lib/llmgw:/var/lib/llmgw localhost/llmgw:latest --role=server --config /etc/llmgw/server.yaml": (
        "`podman run … --role=server …`"
    ),
    "sudo podman run -d --name llmgw-agent --network llmgw --user root -v /etc/llmgw-agent:/etc/llmgw:ro "
    "localhost/llmgw:latest --role=agent --config /etc/llmgw/agent.yaml": "`podman run … --role=agent …`",
}


def test_every_command_the_page_shows_has_a_row_naming_the_test_that_runs_it() -> None:
    text = GUIDE.read_text()
    assert sorted(_commands()) == sorted(_ROWS)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    for command, cell in _ROWS.items():
        row = next((line for first, line in rows.items() if cell in first), None)
        assert row is not None and _TEST_ID.search(row), f"no test is named for {command}"


def test_every_test_the_page_names_exists() -> None:
    for path, name in _TEST_ID.findall(GUIDE.read_text()):
        source = (REPO / path).read_text()
        *classes, function = name.split("::")
        for cls in classes:
            assert f"class {cls}" in source, f"{path} has no class {cls}"
        if function[0].isupper():
            assert f"class {function}" in source, f"{path} has no class {function}"
        else:
            assert re.search(rf"def {function}\(", source), f"{path} has no test {function}"


async def test_the_model_this_page_adds_loads_into_the_configuration_init_writes(tmp_path: Path) -> None:
    options = InitOptions(root=tmp_path, admin=None)
    await init_control_plane(options, FakeSystem(systemd=False), lambda line: None)
    (model,) = [block for block in _blocks("yaml") if "\nmodels:\n" in block]
    written = options.config_path.read_text()
    assert "\nmodels: []\n" in written
    edited = written.replace("\nmodels: []\n", "\n" + model)
    cfg = await asyncio.to_thread(config.parse, ServerConfig, edited, "server.yaml")
    assert [m.name for m in cfg.models] == ["sim-chat"]
    assert cfg.models[0].profiles[0].engine == "sim"
    # The sim-only trial's line: nodes are told to install no llama.cpp.
    assert wanted_engines(cfg.engines) == {}


async def test_a_restarted_server_serves_the_added_model_to_a_key_from_keys_create(
    tmp_path: Path,
) -> None:
    """Steps 4 and 5 on what init wrote: the restart reads the model, `keys create` makes a usable key."""
    options = InitOptions(root=tmp_path, admin=None)
    await init_control_plane(options, FakeSystem(systemd=False), lambda line: None)
    (model,) = [block for block in _blocks("yaml") if "\nmodels:\n" in block]
    path = options.config_path
    path.write_text(path.read_text().replace("\nmodels: []\n", "\n" + model))
    made = await asyncio.to_thread(
        CliRunner().invoke, keys, ["create", "first", "--config", str(path)], catch_exceptions=False
    )
    assert made.exit_code == 0, made.stderr
    key = made.stdout.strip()
    cfg = await asyncio.to_thread(load_server_config, path)
    on_port_0 = config.evolve(
        cfg, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", agent_listen="127.0.0.1:0"
    )
    async with server_role(on_port_0) as server, aiohttp.ClientSession() as session:
        async with session.get(f"{server.admin_url}/api/v1/models") as reply:
            assert [m["name"] for m in await reply.json()] == ["sim-chat"]
        await server.keys.refresh(server.store)
        async with session.get(
            f"{server.gateway_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
        ) as reply:
            assert reply.status == 200
            assert [m["id"] for m in (await reply.json())["data"]] == ["sim-chat"]


def test_the_containers_conf_the_page_shows_is_the_one_the_tests_run_podman_with() -> None:
    """It fixes runc's `error setting rlimit type 7: operation not permitted`, which the page quotes."""
    (shown,) = _blocks("toml")
    assert "error setting rlimit type 7: operation not permitted" in GUIDE.read_text()
    ran = CONTAINERS_CONF.splitlines()
    assert [line for line in shown.splitlines() if line not in ran] == []
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]' in shown
