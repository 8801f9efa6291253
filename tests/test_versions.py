"""The window of agent versions a control plane takes: one minor either side of its own."""

from __future__ import annotations

import pytest

from llmgw.versions import refusal, window


def test_the_window_is_one_minor_version_either_side_and_never_below_zero():
    assert window("0.11.0") == "0.10–0.12"
    assert window("0.1.0") == "0.0–0.2"
    assert window("1.0.0rc1") == "1.0–1.1"


@pytest.mark.parametrize("agent", ["0.10.0", "0.11.7", "0.12.0rc2", "", "dev"])
def test_an_agent_inside_the_window_or_of_no_release_number_is_taken(agent: str):
    assert refusal(agent, "0.11.0") is None


@pytest.mark.parametrize(
    ("agent", "words"),
    [
        ("0.9.0", "agent 0.9.0 is older than this server accepts (0.10–0.12): upgrade it"),
        ("0.13.0", "agent 0.13.0 is newer than this server accepts (0.10–0.12): upgrade the server first"),
        ("1.11.0", "agent 1.11.0 is newer than this server accepts"),
    ],
)
def test_an_agent_outside_the_window_is_refused_saying_which_end_to_upgrade(agent: str, words: str):
    why = refusal(agent, "0.11.0")
    assert why is not None and why.startswith(words)
