"""`llmgw keys create | list | revoke` against the store a server.yaml names."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_CONFIG
from llmgw.cli.keys import keys


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
