"""A model served by an OpenAI-compatible server on a host of its own, outside the fleet: served, checked,
failing in words when its host's link is cut, and serving again once it is restored.

The `ext` host (198.18.0.41) runs no agent, only the fake upstream of tests/gateway/fake_upstream.py as
a process of its own; the server on `cp` names it in `ext-chat`'s `endpoints`, its key in the server's
environment only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ..gateway.fake_upstream import COMPLETION_TOKENS, KEY, NAME, PROMPT_TOKENS
from .cluster import Fleet, Reply, http, llmgw_argv
from .netns import Host, Network, Process, wait_until

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The host this module adds to the session's network, and removes after it.
EXT = ("ext", 41)
UPSTREAM_PORT = 8000
MODEL = "ext-chat"
ENV = "LLMGW_FLEET_UPSTREAM_KEY"
_ROOT = Path(__file__).resolve().parents[2]
# Small, so that a cut link costs a request seconds, not minutes, and a check notices as soon.
TIMEOUTS = {"connect_s": 1.0, "first_byte_s": 2.0, "idle_s": 2.0, "total_s": 5.0}
CONTROL = {"interval_s": 0.5, "grace_s": 3.0, "base_backoff_s": 1.0, "endpoint_check_s": 1.0}


@pytest.fixture(scope="module")
def ext(network: Network) -> Iterator[Host]:
    try:
        yield network.add_host(*EXT)
    finally:
        if EXT[0] in network.hosts:
            network.remove_host(EXT[0])


def _url(ext: Host) -> str:
    return f"http://{ext.address}:{UPSTREAM_PORT}/v1"


def _start_upstream(fleet: Fleet, ext: Host) -> Process:
    """The fake upstream on ext, once it answers the control plane's host (a 401: no key was sent)."""
    argv = [sys.executable, "-m", "tests.gateway.fake_upstream", ext.address, str(UPSTREAM_PORT)]
    process = ext.run(argv, log=fleet.workdir / "logs" / "upstream.log", cwd=_ROOT, name="upstream")
    wait_until(
        lambda: fleet.cp.call(http, "GET", f"{_url(ext)}/models").status == 401 or not process.alive(),
        60,
        "the upstream on ext to answer",
    )
    assert process.alive(), f"the upstream exited:\n{process.output()}"
    return process


def _start(fleet: Fleet, ext: Host, key: str = KEY) -> None:
    """The upstream on ext, and a server on cp whose ext-chat is served by it with key."""
    _start_upstream(fleet, ext)
    model = {
        "name": MODEL,
        "endpoints": [{"url": _url(ext), "model": NAME, "api_key_env": ENV}],
        "timeouts": TIMEOUTS,
    }
    fleet.start_server([model], env={ENV: key}, control=CONTROL)


def _endpoint(fleet: Fleet) -> dict[str, Any]:
    [shown] = fleet.replicas(MODEL)
    return shown


def _state(fleet: Fleet, state: str) -> dict[str, Any] | None:
    shown = _endpoint(fleet)
    return shown if shown["state"] == state else None


def _ctl_replicas(fleet: Fleet) -> str:
    """`llmgw ctl replicas`, run on the control plane's host against its admin API."""
    admin = f"{fleet.gateway}/admin"
    return fleet.cp.exec(llmgw_argv("ctl", "--server", admin, "--token", fleet.admin_token, "replicas"))


def _stream(gateway: str, key: str) -> tuple[str, int, int]:
    """A stream with the official client: (its text, the prompt and completion tokens of its usage)."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=10)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, prompt, completion = "", 0, 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    return text, prompt, completion


def _error(reply: Reply) -> str:
    """The message of an error in OpenAI's shape."""
    assert isinstance(reply.body, dict) and isinstance(reply.body.get("error"), dict), reply.body
    message = reply.body["error"]["message"]
    assert isinstance(message, str)
    return message


def test_a_chat_and_a_stream_to_an_endpoint_on_another_host_come_back_with_its_usage(
    fleet: Fleet, ext: Host
) -> None:
    _start(fleet, ext)
    shown = wait_until(lambda: _state(fleet, "ready"), 30, f"{MODEL}/0 to be ready")
    assert (shown["shard_id"], shown["engine"]) == (f"{MODEL}/0", "endpoint")
    assert shown["node"] == f"{ext.address}:{UPSTREAM_PORT}"

    reply = fleet.chat(MODEL)
    assert reply.status == 200, reply.body
    assert reply.headers["x-llmgw-replica"] == f"{MODEL}/0"
    usage = reply.body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    text, prompt, completion = fleet.cp.call(_stream, fleet.gateway, fleet.key)
    assert text == "onetwothree"
    assert (prompt, completion) == (PROMPT_TOKENS, COMPLETION_TOKENS)

    listed = _ctl_replicas(fleet)
    assert f"{MODEL}/0" in listed and "endpoint ready" in listed, listed


def test_an_endpoint_whose_host_is_cut_off_fails_requests_in_words_and_serves_again_once_restored(
    fleet: Fleet, ext: Host
) -> None:
    _start(fleet, ext)
    wait_until(lambda: _state(fleet, "ready"), 30, f"{MODEL}/0 to be ready")
    assert fleet.chat(MODEL).status == 200

    ext.cut_link()

    # Routed there before anything noticed: a 502 or 504 within the model's timeouts, naming it.
    reply = fleet.chat(MODEL, timeout_s=30)
    assert reply.status in (502, 504), reply.body
    message = _error(reply)
    assert f"{MODEL}/0" in message and ext.address in message, message
    # Said by the request that timed out, or by a check that did: either names its host.
    failing = wait_until(lambda: _state(fleet, "failing"), 30, f"{MODEL}/0 to be marked failing")
    assert ext.address in failing["detail"], failing
    listed = _ctl_replicas(fleet)
    assert "endpoint failing" in listed and ext.address in listed, listed
    # Out of the routing table: refused at once, saying why.
    reply = fleet.chat(MODEL, timeout_s=30)
    assert reply.status == 503, reply.body
    message = _error(reply)
    assert f"{MODEL}/0" in message and ext.address in message, message

    ext.restore_link()

    wait_until(lambda: _state(fleet, "ready"), 30, f"{MODEL}/0 to be ready again")
    assert fleet.chat(MODEL).status == 200


def test_an_endpoint_on_another_host_that_refuses_the_server_s_key_is_failing_in_words(
    fleet: Fleet, ext: Host
) -> None:
    _start(fleet, ext, key="sk-not-the-upstream-s-key")

    failing = wait_until(lambda: _state(fleet, "failing"), 30, f"{MODEL}/0 to fail its check")
    assert failing["detail"] == f"{_url(ext)} answered 401: its key is wrong (api_key_env {ENV})"
    reply = fleet.chat(MODEL)
    assert reply.status == 503, reply.body
    assert "its key is wrong" in _error(reply)
