"""`llmgw keys create | list | revoke` against the store a server.yaml names."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_CONFIG
from llmgw.cli.keys import keys
from llmgw.store import open_store
from llmgw.store.catalog import put_model
from llmgw.store.keys import KeyRecord, list_keys
from llmgw.store.scopes import create_project


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(keys, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


class TestKeysCommand:
    def test_create_prints_the_key_alone_on_stdout_and_stores_it_in_the_configured_state_dir(
        self, config: Path, tmp_path: Path
    ) -> None:
        code, out, err = _run("create", "ci", "--config", str(config))
        assert code == 0
        assert out.startswith("sk-llmgw-") and out.count("\n") == 1
        assert "shown only this once" in err
        assert (tmp_path / "state" / "llmgw.db").exists()

    def test_list_shows_the_prefix_and_name_but_never_the_key(self, config: Path) -> None:
        _, key, _ = _run("create", "ci-bot", "--config", str(config))
        code, out, _ = _run("list", "--config", str(config))
        assert code == 0
        assert key.strip()[:17] in out and "ci-bot" in out and "active" in out
        assert key.strip() not in out

    def test_revoke_by_the_prefix_list_shows_marks_the_key_revoked(self, config: Path) -> None:
        _, key, _ = _run("create", "ci", "--config", str(config))
        code, out, _ = _run("revoke", key.strip()[:17] + "…", "--config", str(config))
        assert code == 0 and "is revoked since" in out
        assert "revoked" in _run("list", "--config", str(config))[1]

    def test_revoking_an_unknown_prefix_fails_saying_so(self, config: Path) -> None:
        code, _, err = _run("revoke", "sk-llmgw-nothere0", "--config", str(config))
        assert code == 1 and "no key has the prefix 'sk-llmgw-nothere0'" in err

    def test_a_bad_configuration_exits_with_the_config_code_naming_the_key(self, tmp_path: Path) -> None:
        bad = tmp_path / "server.yaml"
        bad.write_text("stat_dir: /tmp\n")
        code, _, err = _run("list", "--config", str(bad))
        assert code == EXIT_CONFIG and "did you mean 'state_dir'" in err


_DECLARED = """\
models:
  - name: sim-chat
    profiles: [{engine: sim}]
"""


@pytest.fixture
def with_models(config: Path, tmp_path: Path) -> Path:
    """A server whose catalog has sim-chat (server.yaml) and org/sim-big (added with ctl, in the store)."""
    config.write_text(config.read_text() + _DECLARED)
    asyncio.run(_add_model(tmp_path, "org/sim-big"))
    return config


class TestKeyOptions:
    def test_a_key_is_created_in_a_named_project_with_an_expiry_and_a_model_allow_list(
        self, with_models: Path, tmp_path: Path
    ) -> None:
        config = with_models
        asyncio.run(_project(tmp_path, "research <&>"))
        code, _, err = _run(
            "create",
            "bot",
            "--project",
            "research <&>",
            "--expires",
            "2999-01-31",
            "--model",
            "sim-chat",
            "--model",
            "org/sim-big",
            "--config",
            str(config),
        )
        assert code == 0, err
        assert "in project 'research <&>' (team 'default', org 'default'), until 2999-01-31 00:00 UTC" in err
        assert "for sim-chat, org/sim-big only" in err
        (record,) = asyncio.run(_keys(tmp_path))
        assert record.project_id == 2 and record.models == ("sim-chat", "org/sim-big")
        assert record.expires_at == datetime(2999, 1, 31, tzinfo=UTC)
        assert "expires 2999-01-31 00:00" in _run("list", "--config", str(config))[1]

    def test_without_options_a_key_goes_to_the_default_project_for_any_model_for_ever(
        self, config: Path, tmp_path: Path
    ) -> None:
        assert _run("create", "ci", "--config", str(config))[0] == 0
        (record,) = asyncio.run(_keys(tmp_path))
        assert (record.project_id, record.models, record.expires_at) == (1, None, None)

    def test_an_unknown_project_is_refused_naming_the_projects_there_are(self, config: Path) -> None:
        code, out, err = _run("create", "bot", "--project", "nope", "--config", str(config))
        assert code == 1 and out == ""
        assert err == "llmgw: there is no project 'nope'; the projects are 1 (default)\n"

    def test_an_expiry_in_the_past_is_refused(self, config: Path) -> None:
        result = CliRunner().invoke(
            keys, ["create", "bot", "--expires", "2001-01-01", "--config", str(config)]
        )
        assert result.exit_code == 2
        assert "Invalid value for '--expires': 2001-01-01 00:00 UTC has already passed" in result.stderr

    def test_a_key_for_a_model_the_catalog_does_not_have_is_refused_naming_the_ones_it_has(
        self, with_models: Path, tmp_path: Path
    ) -> None:
        code, out, err = _run(
            "create", "bot", "--model", "sim-chat", "--model", "sim-chta", "--config", str(with_models)
        )
        assert (code, out) == (1, "")
        assert err == (
            "llmgw: the catalog has no model sim-chta; it has org/sim-big, sim-chat "
            "(`llmgw ctl models` lists them)\n"
        )
        assert asyncio.run(_keys(tmp_path)) == []

    def test_a_key_for_a_model_is_refused_when_the_catalog_is_empty(self, config: Path) -> None:
        code, _, err = _run("create", "bot", "--model", "sim-chat", "--config", str(config))
        assert code == 1 and "the catalog has no model sim-chat; it has none" in err

    @pytest.mark.parametrize("name", ["two\nlines", "tab\there", "x" * 101, "   "])
    def test_a_key_name_that_would_break_a_listing_is_refused(self, config: Path, name: str) -> None:
        result = CliRunner().invoke(keys, ["create", name, "--config", str(config)])
        assert result.exit_code == 2
        assert "Invalid value for NAME" in result.stderr


async def _add_model(tmp_path: Path, name: str) -> None:
    async with open_store(tmp_path / "state" / "llmgw.db") as store:
        await put_model(store, name, f"name: {name}\nprofiles: [{{engine: sim}}]\n", "model.yaml")


async def _project(tmp_path: Path, name: str) -> None:
    async with open_store(tmp_path / "state" / "llmgw.db") as store:
        await create_project(store, 1, name)


async def _keys(tmp_path: Path) -> list[KeyRecord]:
    async with open_store(tmp_path / "state" / "llmgw.db") as store:
        return await list_keys(store)
