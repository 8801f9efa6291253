"""`llmgw users create | approve | promote | disable | list` against the store a server.yaml names."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_CONFIG
from llmgw.cli.main import main
from llmgw.config.classes import OidcConfig
from llmgw.store import open_store
from llmgw.store.keys import create_key, find_key, hash_key
from llmgw.store.scopes import create_project
from llmgw.store.users import authenticate, link_key
from llmgw.web.oidc import sign_in


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["users", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _signs_in(tmp_path: Path, email: str, password: str) -> bool:
    async def check() -> bool:
        async with open_store(tmp_path / "state" / "llmgw.db") as store:
            user = await authenticate(store, email, password)
            return user is not None and user.active

    return asyncio.run(check())


class TestUsersCommand:
    def test_the_first_administrator_is_created_then_promoted_and_can_sign_in(
        self, config: Path, tmp_path: Path
    ) -> None:
        code, _, err = _run(
            "create", "root@example.com", "--password", "s3cret-enough", "--config", str(config)
        )
        assert code == 0 and "created user 1 root@example.com" in err
        assert not _signs_in(tmp_path, "root@example.com", "s3cret-enough"), (
            "pending until promoted or approved"
        )
        code, out, _ = _run("promote", "1", "--config", str(config))
        assert code == 0 and out.strip() == "user 1 root@example.com: active administrator, no project"
        assert _signs_in(tmp_path, "root@example.com", "s3cret-enough")

    def test_without_a_password_one_is_generated_and_printed_alone_on_stdout(
        self, config: Path, tmp_path: Path
    ) -> None:
        code, out, err = _run("create", "ann@example.com", "--config", str(config))
        assert code == 0 and out.count("\n") == 1 and "shown only this once" in err
        _run("approve", "1", "--project", "default", "--config", str(config))
        assert _signs_in(tmp_path, "ann@example.com", out.strip())

    def test_approve_puts_the_account_in_a_project_named_by_name_or_id(
        self, config: Path, tmp_path: Path
    ) -> None:
        _run("create", "ann@example.com", "--config", str(config))

        async def add_project() -> int:
            async with open_store(tmp_path / "state" / "llmgw.db") as store:
                return (await create_project(store, 1, "research")).id

        project_id = asyncio.run(add_project())
        code, out, _ = _run("approve", "1", "--project", "research", "--config", str(config))
        assert code == 0
        assert out.strip() == (
            "user 1 ann@example.com: active user, project 'research' (team 'default', org 'default')"
        )
        code, out, _ = _run("approve", "1", "--project", str(project_id), "--config", str(config))
        assert code == 0 and "project 'research'" in out

    def test_approving_into_an_unknown_project_lists_the_projects(self, config: Path) -> None:
        _run("create", "ann@example.com", "--config", str(config))
        code, _, err = _run("approve", "1", "--project", "nope", "--config", str(config))
        assert code == 1 and "there is no project 'nope'; the projects are 1 (default)" in err

    def test_disable_stops_the_account_signing_in(self, config: Path, tmp_path: Path) -> None:
        _run("create", "ann@example.com", "--password", "password1", "--config", str(config))
        _run("approve", "1", "--project", "1", "--config", str(config))
        code, out, _ = _run("disable", "1", "--config", str(config))
        assert code == 0 and "disabled user" in out and "signed out everywhere" in out
        assert not _signs_in(tmp_path, "ann@example.com", "password1")

    @pytest.mark.parametrize("setting", ["keep", "revoke"])
    def test_disabling_keeps_or_revokes_the_accounts_keys_as_the_setting_says(
        self, config: Path, tmp_path: Path, setting: str
    ) -> None:
        config.write_text(config.read_text() + f"auth:\n  disabled_user_keys: {setting}\n")
        _run("create", "ann@example.com", "--password", "password1", "--config", str(config))
        _run("approve", "1", "--project", "1", "--config", str(config))

        async def make_key() -> str:
            async with open_store(tmp_path / "state" / "llmgw.db") as store:
                plaintext, record = await create_key(store, "laptop", project_id=1)
                await link_key(store, record.id, 1)
                return plaintext

        async def key_works(plaintext: str) -> bool:
            async with open_store(tmp_path / "state" / "llmgw.db") as store:
                found = await find_key(store, hash_key(plaintext))
                return found is not None and found.revoked_at is None

        plaintext = asyncio.run(make_key())
        code, out, _ = _run("disable", "1", "--config", str(config))
        assert code == 0
        assert ("1 of its keys revoked" in out) == (setting == "revoke")
        assert asyncio.run(key_works(plaintext)) == (setting == "keep")

    def test_list_shows_every_account_with_status_role_and_project(self, config: Path) -> None:
        _run("create", "root@example.com", "--config", str(config))
        _run("promote", "1", "--config", str(config))
        _run("create", "new@example.com", "--config", str(config))
        code, out, _ = _run("list", "--config", str(config))
        lines = out.splitlines()
        assert code == 0 and lines[0].split() == [
            "ID",
            "EMAIL",
            "STATUS",
            "ROLE",
            "SOURCE",
            "CREATED",
            "(UTC)",
            "GROUPS",
            "PROJECT",
        ]
        assert lines[1].split()[:5] == ["1", "root@example.com", "active", "admin", "local"]
        assert lines[2].split()[:4] == ["2", "new@example.com", "pending", "user"] and lines[2].endswith(" -")

    def test_an_unknown_user_or_a_taken_email_fails_in_a_sentence(self, config: Path) -> None:
        code, _, err = _run("promote", "7", "--config", str(config))
        assert code == 1 and "there is no user 7; `llmgw users list` shows them" in err
        _run("create", "ann@example.com", "--config", str(config))
        code, _, err = _run("create", "ANN@example.com", "--config", str(config))
        assert code == 1 and "there is already an account for ANN@example.com" in err

    @pytest.mark.parametrize("digit", ["\u0662", "\uff12", "\u00b2"])
    def test_an_id_in_another_scripts_digits_is_refused_and_acts_on_nobody(
        self, config: Path, tmp_path: Path, digit: str
    ) -> None:
        """int() reads "٢" (Arabic-Indic) and "２" (full-width) as 2: `users approve ٢` approved user 2."""
        _run("create", "root@example.com", "--config", str(config))
        _run("create", "ann@example.com", "--password", "password1", "--config", str(config))
        for command in (["approve", digit, "--project", "default"], ["promote", digit], ["disable", digit]):
            code, _, err = _run(*command, "--config", str(config))
            assert code == 2 and f"'{digit}' is not an id; an id is written in the digits 0-9" in err, command
        assert not _signs_in(tmp_path, "ann@example.com", "password1")
        code, out, _ = _run("list", "--config", str(config))
        assert out.splitlines()[2].split()[:4] == ["2", "ann@example.com", "pending", "user"]

    def test_a_bad_configuration_exits_with_the_config_code(self, tmp_path: Path) -> None:
        bad = tmp_path / "server.yaml"
        bad.write_text("stat_dir: /tmp\n")
        code, _, err = _run("list", "--config", str(bad))
        assert code == EXIT_CONFIG and "did you mean 'state_dir'" in err


def test_list_shows_an_account_the_provider_made_with_its_source_and_groups(
    config: Path, tmp_path: Path
) -> None:
    _run("create", "root@example.com", "--config", str(config))

    async def provider_signs_in() -> None:
        async with open_store(tmp_path / "state" / "llmgw.db") as store:
            cfg = OidcConfig(groups={"llm-admins": "admin", "ml team": "project:default"})
            claims = {"email": "ada@example.com", "groups": ["ml team", "llm-admins", "other"]}
            await sign_in(store, cfg, claims)

    asyncio.run(provider_signs_in())
    code, out, _ = _run("list", "--config", str(config))
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[4] == "local" and lines[1].split()[7] == "-"
    assert lines[2].split()[:5] == ["2", "ada@example.com", "active", "admin", "oidc"]
    assert lines[2].split()[7] == "ml_team,llm-admins,other"
