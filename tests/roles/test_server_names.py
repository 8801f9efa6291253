"""Model names with a slash round-trip through ctl and the admin API; names that climb are refused."""

from __future__ import annotations

import json
from pathlib import Path

from structlog.testing import capture_logs

from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND
from llmgw.config import ServerConfig
from llmgw.roles.server import server_role
from llmgw.store import open_store
from llmgw.store.catalog import list_models, put_model

# The catalog tests' server (sim-chat, auth off, a quick reconciler) and their ctl and listing.
from tests.roles.test_server_catalog import _ctl, _listed, cfg  # noqa: F401

ORG_MODEL = "meta-llama/Llama-3.1-8B"


async def test_an_org_model_is_added_explained_listed_and_removed_with_ctl(
    cfg: ServerConfig,  # noqa: F811
    tmp_path: Path,
):
    model_file = tmp_path / "model.yaml"
    model_file.write_text(f"name: {ORG_MODEL}\nreplicas: 0\nprofiles:\n  - engine: sim\n", encoding="utf-8")
    with capture_logs():
        async with server_role(cfg) as server:
            admin = ("--server", server.admin_url)
            code, out, err = await _ctl(*admin, "model", "add", "-f", str(model_file))
            assert (code, err) == (0, "")
            assert out == f"added {ORG_MODEL}: 0 replica(s) wanted, placed from now on\n"
            assert await _listed(server.gateway_url) == ["sim-chat", ORG_MODEL]
            code, out, err = await _ctl(*admin, "--json", "explain", ORG_MODEL)
            assert code == 0, err
            code, out, err = await _ctl(*admin, "replicas", "--model", ORG_MODEL)
            assert code == 0, err
            code, out, err = await _ctl(*admin, "model", "remove", ORG_MODEL)
            assert (code, out, err) == (0, f"removed {ORG_MODEL}: its replicas are being stopped\n", "")
            assert await _listed(server.gateway_url) == ["sim-chat"]


async def test_a_name_that_climbs_out_of_a_directory_is_refused_by_ctl_with_what_is_allowed(
    cfg: ServerConfig,  # noqa: F811
    tmp_path: Path,
):
    escape = tmp_path / "escape.yaml"
    escape.write_text("name: ../../../escape\nprofiles:\n  - engine: sim\n", encoding="utf-8")
    with capture_logs():
        async with server_role(cfg) as server:
            code, _, err = await _ctl("--server", server.admin_url, "model", "add", "-f", str(escape))
            assert code == EXIT_ERROR
            assert err.startswith(
                f"llmgw ctl: {escape}:1: the model name '../../../escape' is not allowed; a model name is"
            )
            # Sent as one encoded segment: the server is asked about that name, not about a path
            # the client shortened to /escape.
            code, _, err = await _ctl("--server", server.admin_url, "model", "remove", "../../../escape")
            assert code == EXIT_NOT_FOUND
            assert "no model ../../../escape was added with ctl" in err


async def test_a_stored_model_whose_name_is_no_longer_allowed_is_removed_with_ctl(
    cfg: ServerConfig,  # noqa: F811
    tmp_path: Path,
):
    """Added by an older release, before names were checked: never served, and ctl takes it out."""
    async with open_store(cfg.database_path) as store:
        await put_model(store, "../../../escape", "name: ../../../escape\nprofiles: [{engine: sim}]\n", "x")
    with capture_logs():
        async with server_role(cfg) as server:
            assert await _listed(server.gateway_url) == ["sim-chat"]
            code, out, err = await _ctl("--server", server.admin_url, "model", "remove", "../../../escape")
            assert (code, err) == (0, "")
            assert out == "removed ../../../escape: its replicas are being stopped\n"
    async with open_store(cfg.database_path) as store:
        assert await list_models(store) == []


async def test_ctl_with_the_config_dials_the_admin_port_the_server_bound_not_the_configured_one(
    cfg: ServerConfig,  # noqa: F811
    tmp_path: Path,
):
    """`--admin-listen 127.0.0.1:0`: server.yaml's port is not the one listening; the record is."""
    config_path = tmp_path / "server.yaml"
    # Port 9 (discard): nothing llmgw listens on; dialling it is the failure this guards against.
    config_path.write_text(f"admin_listen: 127.0.0.1:9\nstate_dir: {cfg.state_dir}\n", encoding="utf-8")
    record = Path(cfg.state_dir) / "listening.json"
    with capture_logs():
        async with server_role(cfg) as server:
            assert json.loads(record.read_text())["admin"] == server.admin_url.removeprefix("http://")
            code, out, err = await _ctl("--config", str(config_path), "status")
            assert (code, err) == (0, "")
            assert "models    0 of 1 serving" in out
    # Gone with the server, so ctl does not dial a port nobody holds any more.
    assert not record.exists()
