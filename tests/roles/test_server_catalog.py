"""`llmgw ctl model add/remove` against a real server: what ctl added is served, after a restart too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.cli.ctl import ctl
from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND
from llmgw.config import AuthConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.roles.server import server_role
from llmgw.store.quotas import set_budget
from llmgw.store.scopes import Scope
from tests.servers import loopback_server_config

ADDED = """\
name: sim-added
replicas: 1
profiles:
  - engine: sim
fallbacks: [sim-chat]
"""


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        hosts=("127.0.0.1", "localhost"),
        auth=AuthConfig(enabled=False),
        control=ControlConfig(interval_s=0.2),
        models=[ModelConfig(name="sim-chat", replicas=0, profiles=[ProfileConfig(engine="sim")])],
    )


async def _ctl(*args: str) -> tuple[int, str, str]:
    # In a thread: ctl runs its own event loop, and the server it talks to runs on this one.
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def _listed(gateway_url: str) -> list[str]:
    async with aiohttp.ClientSession() as session, session.get(gateway_url + "/v1/models") as reply:
        return [m["id"] for m in (await reply.json())["data"]]


async def test_a_model_added_with_ctl_is_served_after_a_restart_until_ctl_removes_it(
    cfg: ServerConfig, tmp_path: Path
):
    model_file = tmp_path / "model.yaml"
    model_file.write_text(ADDED, encoding="utf-8")
    with capture_logs():
        async with server_role(cfg) as server:
            code, out, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(model_file))
            assert (code, err) == (0, "")
            assert out == "added sim-added: 1 replica(s) wanted, placed from now on\n"
            assert await _listed(server.gateway_url) == ["sim-chat", "sim-added"]
        async with server_role(cfg) as server:
            assert await _listed(server.gateway_url) == ["sim-chat", "sim-added"]
            code, out, _ = await _ctl("--server", server.admin_url, "model", "remove", "sim-added")
            assert (code, out) == (0, "removed sim-added: its replicas are being stopped\n")
            assert await _listed(server.gateway_url) == ["sim-chat"]
        async with server_role(cfg) as server:
            assert await _listed(server.gateway_url) == ["sim-chat"]


async def test_adding_a_model_with_no_price_while_a_budget_is_set_says_budgets_never_bind_on_it(
    cfg: ServerConfig, tmp_path: Path
):
    model_file = tmp_path / "model.yaml"
    model_file.write_text(ADDED, encoding="utf-8")
    priced = tmp_path / "priced.yaml"
    priced.write_text(
        ADDED.replace("sim-added", "sim-priced") + "pricing: {prompt_per_1k: 1.0}\n", encoding="utf-8"
    )
    with capture_logs():
        async with server_role(cfg) as server:
            await set_budget(server.store, Scope("org", 1), 10.0, "month")
            await server.quotas.refresh(server.store)
            code, out, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(model_file))
            assert code == 0
            assert out == "added sim-added: 1 replica(s) wanted, placed from now on\n"
            assert err == (
                "warning: no price applies to sim-added, so budgets never bind on what it serves; give it "
                "`pricing` (in server.yaml or the model's definition) or set `default_price`\n"
            )
            code, out, _ = await _ctl("--server", server.admin_url, "models", "--json")
            unpriced = {m["name"]: m["unpriced"] for m in json.loads(out)}
            assert unpriced["sim-added"] is not None and unpriced["sim-chat"] is not None
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(priced))
            assert (code, err) == (0, "")


async def test_ctl_refuses_a_bad_definition_naming_the_file_and_line_and_leaves_server_yaml_s_alone(
    cfg: ServerConfig, tmp_path: Path
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: sim-bad\nprofiles:\n  - engine: sim\n    gpu_clas: h100-80g\n", encoding="utf-8")
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text("name: sim-chat\nprofiles:\n  - engine: sim\n", encoding="utf-8")
    with capture_logs():
        async with server_role(cfg) as server:
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(bad))
            assert code == EXIT_ERROR
            assert err == (
                f"llmgw ctl: {bad}:4: unknown key 'profiles[0].gpu_clas'; did you mean 'gpu_class'?\n"
            )
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(shadow))
            assert code == EXIT_ERROR
            assert "sim-chat is declared in server.yaml; change it there and restart" in err
            code, _, err = await _ctl("--server", server.admin_url, "model", "remove", "sim-chat")
            assert code == EXIT_ERROR
            assert "sim-chat is declared in server.yaml; remove it there and restart" in err
            code, _, err = await _ctl("--server", server.admin_url, "model", "remove", "nope")
            assert code == EXIT_NOT_FOUND
            assert await _listed(server.gateway_url) == ["sim-chat"]


async def test_ctl_refuses_a_definition_of_nested_aliases_or_a_list_for_a_name_and_adds_nothing(
    cfg: ServerConfig, tmp_path: Path
):
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(
        'name: lol\nprofiles: [{engine: sim}]\na: &a ["lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(
            f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        encoding="utf-8",
    )
    listed = tmp_path / "listed.yaml"
    listed.write_text("name: [sim-a, sim-b]\nprofiles:\n  - engine: sim\n", encoding="utf-8")
    with capture_logs():
        async with server_role(cfg) as server:
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(laughs))
            assert (code, err) == (
                EXIT_ERROR,
                f"llmgw ctl: {laughs}:7: uses more than 32 aliases (*name); write the values out\n",
            )
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(listed))
            assert (code, err) == (
                EXIT_ERROR,
                f"llmgw ctl: {listed}:1: 'name' is ['sim-a', 'sim-b']; expected a string\n",
            )
            assert await _listed(server.gateway_url) == ["sim-chat"]
