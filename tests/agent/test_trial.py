"""An agent on trial after an upgrade: what it finds as it starts, and the bootstrap's way back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent import trial


def _marker(state: str = trial.TRIAL, **more: object) -> trial.Marker:
    fields: dict[str, object] = {"to": "0.2.0", "from_version": "0.1.0", "state": state, **more}
    return trial.Marker(**fields)  # type: ignore[arg-type]


class TestWhatAnAgentFindsAsItStarts:
    def test_the_agent_of_the_version_on_trial_is_on_trial(self, tmp_path: Path) -> None:
        trial.write(tmp_path, _marker())
        marker, on_trial = trial.settle(tmp_path, "0.2.0")
        assert on_trial and marker is not None and marker.state == trial.TRIAL

    def test_the_previous_agent_finding_a_trial_says_the_new_one_stopped_before_it_registered(
        self, tmp_path: Path
    ) -> None:
        """What a process supervisor restarting the unit's own path (the previous release) finds."""
        trial.write(tmp_path, _marker())
        marker, on_trial = trial.settle(tmp_path, "0.1.0")
        assert not on_trial
        assert marker is not None and marker.state == trial.ROLLED_BACK
        assert marker.detail == "the agent of 0.2.0 stopped before it registered"
        assert trial.read(tmp_path) == marker

    def test_no_marker_or_an_unreadable_one_is_no_trial(self, tmp_path: Path) -> None:
        assert trial.settle(tmp_path, "0.1.0") == (None, False)
        (tmp_path / trial.MARKER).write_text("{not json")
        assert trial.settle(tmp_path, "0.1.0") == (None, False)


def test_the_bootstrap_goes_back_to_the_previous_command_when_the_new_release_cannot_be_imported(
    tmp_path: Path, broken_release: Path
) -> None:
    previous = [
        sys.executable,
        "-c",
        "import os; print('previous agent, PYTHONPATH=' + os.environ['PYTHONPATH'])",
    ]
    trial.write(tmp_path, _marker(previous=previous, previous_pythonpath="/srv/old"))

    (tmp_path / "bin").mkdir()
    script = trial.script(tmp_path / "bin" / "python", trial.TRIAL_SCRIPT, trial.BOOTSTRAP)
    done = subprocess.run(
        [sys.executable, str(script), "--role=agent"],
        env={"PYTHONPATH": str(broken_release), trial.TRIAL_ENV: str(tmp_path / trial.MARKER)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.stdout.strip() == "previous agent, PYTHONPATH=/srv/old", done.stderr
    marker = trial.read(tmp_path)
    assert marker is not None and marker.state == trial.ROLLED_BACK
    assert marker.detail == "the new agent cannot start: ImportError: this build is broken"


def test_the_new_agents_command_line_names_its_release_role_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was `python -c` and thirty lines of bootstrap: `ps` showed them, `pgrep -f` missed the config."""
    monkeypatch.setattr(
        sys, "argv", ["/usr/local/bin/llmgw", "--role=agent", "--config", "/etc/llmgw/agent.yaml"]
    )
    bin_dir = tmp_path / "versions" / "0.2.0" / "bin"
    bin_dir.mkdir(parents=True)

    restart = trial.into(bin_dir / "python", tmp_path)

    assert restart.argv == [
        str(bin_dir / "python"),
        str(bin_dir / "llmgw-trial"),
        "--role=agent",
        "--config",
        "/etc/llmgw/agent.yaml",
    ]
    assert (bin_dir / "llmgw-trial").read_text() == trial.BOOTSTRAP
    assert restart.env[trial.TRIAL_ENV] == str(tmp_path / trial.MARKER)
