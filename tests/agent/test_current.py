"""An agent started from another environment than the release its node committed to runs that release."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from llmgw.agent import current, trial

ARGV = ["/usr/local/bin/llmgw", "--role=agent", "--config", "/etc/llmgw/agent.yaml"]


def _committed(state_dir: Path, version: str = "0.2.0", *, python: bool = True) -> Path:
    """state_dir upgraded to version: its environment (with bin/python, unless not), and current."""
    environment = state_dir / "versions" / version
    (environment / "bin").mkdir(parents=True)
    if python:
        (environment / "bin" / "python").symlink_to(sys.executable)
    current.current(state_dir).symlink_to(version)
    trial.write(state_dir, trial.Marker(to=version, from_version="0.1.0", state=trial.UPGRADED))
    return environment


def _restart(state_dir: Path, env: dict[str, str], **more: object) -> trial.Restart | None:
    fields: dict[str, object] = {"version": "0.1.0", "prefix": Path("/usr/local"), "argv": ARGV, **more}
    return current.restart_into_current(state_dir, env=env, **fields)  # type: ignore[arg-type]


class TestWhetherAnAgentRunsTheCommittedRelease:
    def test_an_agent_of_another_environment_execs_into_current_with_the_same_arguments(
        self, tmp_path: Path
    ) -> None:
        environment = _committed(tmp_path)
        env = {"PYTHONPATH": "/srv/old", "HOME": "/root"}

        with capture_logs() as logs:
            restart = _restart(tmp_path, env)

        assert restart is not None
        script = environment / "bin" / current.SCRIPT
        # What `ps` and `pgrep -f` read: the release, the role and the config, on one line.
        assert restart.argv == [str(environment / "bin" / "python"), str(script), *ARGV[1:]]
        assert script.read_text() == current.BOOTSTRAP
        assert "PYTHONPATH" not in restart.env and restart.env["HOME"] == "/root"
        assert json.loads(restart.env[current.FROM_ENV])["pythonpath"] == "/srv/old"
        assert [e["event"] for e in logs] == [
            f"running llmgw 0.2.0 from {environment}, the release this node was upgraded to; "
            "/usr/local/bin/llmgw is 0.1.0"
        ]

    def test_a_node_never_upgraded_runs_as_it_is(self, tmp_path: Path) -> None:
        assert _restart(tmp_path, {}) is None

    def test_an_agent_already_running_from_current_runs_as_it_is(self, tmp_path: Path) -> None:
        environment = _committed(tmp_path)
        assert _restart(tmp_path, {}, prefix=environment, version="0.2.0-dev") is None

    def test_an_agent_exec_ed_into_current_never_execs_again(self, tmp_path: Path) -> None:
        """The loop guard: the variable the exec sets, taken away so that a later start is not guarded."""
        _committed(tmp_path)
        env = {current.FROM_ENV: "{}"}
        assert _restart(tmp_path, env) is None
        assert env == {}

    def test_the_agent_of_the_release_on_trial_runs_from_its_own_environment(self, tmp_path: Path) -> None:
        _committed(tmp_path)
        trial.write(tmp_path, trial.Marker(to="0.3.0", from_version="0.2.0", state=trial.TRIAL))
        assert _restart(tmp_path, {}, version="0.3.0", prefix=tmp_path / "versions" / "0.3.0") is None

    def test_a_trial_that_failed_is_recorded_rolled_back_and_the_committed_release_runs(
        self, tmp_path: Path
    ) -> None:
        """The new release died before it registered; the supervisor started the unit's own path."""
        _committed(tmp_path)
        trial.write(tmp_path, trial.Marker(to="0.3.0", from_version="0.2.0", state=trial.TRIAL))

        assert _restart(tmp_path, {}) is not None
        marker = trial.read(tmp_path)
        assert marker is not None and marker.state == trial.ROLLED_BACK

    @pytest.mark.parametrize("python", [True, False])
    def test_a_current_that_is_missing_or_has_no_interpreter_is_not_run_and_the_agent_says_so(
        self, tmp_path: Path, python: bool
    ) -> None:
        environment = _committed(tmp_path, python=python)
        if python:
            (environment / "bin" / "python").unlink()
            environment.rename(tmp_path / "versions" / "gone")

        with capture_logs() as logs:
            assert _restart(tmp_path, {}) is None

        assert [e["log_level"] for e in logs] == ["warning"]
        assert "has no interpreter" in logs[0]["event"] and "llmgw ctl upgrade" in logs[0]["event"]

    def test_a_current_that_cannot_be_imported_is_not_run_again_and_the_agent_says_why(
        self, tmp_path: Path
    ) -> None:
        _committed(tmp_path)
        env = {current.FAILED_ENV: "cannot start: ImportError: this build is broken"}

        with capture_logs() as logs:
            assert _restart(tmp_path, env) is None

        assert env == {}
        assert "ImportError: this build is broken" in logs[0]["event"], logs


def test_the_bootstrap_goes_back_to_the_command_it_came_from_when_current_cannot_be_imported(
    broken_release: Path, tmp_path: Path
) -> None:
    came_from = [
        sys.executable,
        "-c",
        "import os; print(os.environ['PYTHONPATH'], os.environ['LLMGW_CURRENT_FAILED'])",
    ]

    (tmp_path / "bin").mkdir()
    script = trial.script(tmp_path / "bin" / "python", current.SCRIPT, current.BOOTSTRAP)
    done = subprocess.run(
        [sys.executable, str(script), "--role=agent"],
        env={
            "PYTHONPATH": str(broken_release),
            current.FROM_ENV: json.dumps({"argv": came_from, "pythonpath": "/srv/old"}),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.stdout.strip() == "/srv/old cannot start: ImportError: this build is broken", done.stderr
