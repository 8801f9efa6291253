"""A real vLLM (its CPU build) in the whole system: installed by the agent, fed from the mirror, serving.

Three `llmgw` processes on loopback, as an operator runs them: a mirror holding
two tiny Hugging Face directories (scripts/make_tiny_hf_model.py), a server
whose catalog names them by the mirror's URL with every file's sha256 pinned
and whose `engines:` asks for vLLM 0.32.0, and an agent that provisions vLLM
itself. The agent's engines directory is the build cache the real-engine
tests share (tests/vllm_env.py), so it finds vLLM installed by the same
installer and only rechecks it; agent.yaml's `engines.vllm.index_url` is what
it would install from here.

One setup for the module: vLLM takes 100 to 200 s to start on 2 shared cores,
so both models start once, side by side. The second model has a head size
of 16, which vLLM's CPU attention cannot run: it answers /health, then dies
at its first request, and the test holds that the system says why in words.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import openai
import psutil
import pytest

from llmgw import bound, pki
from llmgw.agent.provision.place import MARKER
from llmgw.agent.state import read_state
from llmgw.engines.vllm import SERVER_MODULE

from ..vllm_env import ENGINES, INDEX, INSTALL_WITHIN_S, INSTALLED, VERSION
from .conftest import _pump

ROOT = Path(__file__).resolve().parents[2]
NODE = "cpu-01"
CHAT = "tiny-chat"
HEADS = "tiny-heads"
# Two vLLMs starting side by side on 2 shared cores: each alone answers /health in 100 to 200 s.
READY_WITHIN_S = 900.0
WAIT_S = 120.0
HEAD_DIM_16 = "Unsupported CPU attention configuration: head_dim=16"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(INSTALL_WITHIN_S + READY_WITHIN_S + 600),
]

T = TypeVar("T")


@attrs.define
class Fleet:
    gateway: str
    admin: str
    server_yaml: Path
    agent_state: Path
    # The installed environment's marker as it was before the agent started.
    marker_before: str
    # Seconds from the server's start, CHAT in its catalog, to CHAT's first streamed token.
    first_token_s: float = 0.0
    outputs: dict[str, list[str]] = attrs.Factory(dict)


def _until(what: str, check: Callable[[], T | None], within_s: float, explain: Callable[[], str]) -> T:
    """Poll another process's progress until check gives a value; fail saying how things stand."""
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within_s:g} s waiting for {what}:\n{explain()}")
        time.sleep(0.5)


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def _post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw.decode(errors="replace")


def _llmgw(args: list[str], log: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "--log-format=json", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    threading.Thread(target=_pump, args=(process.stdout, log, threading.Event()), daemon=True).start()
    return process


def _ctl(server_yaml: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--config", str(server_yaml), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _tiny_model(out: Path, *args: str) -> dict[str, str]:
    """A tiny HF directory under out; the sha256 of each of its files, as a catalog pins them."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_hf_model.py"), "--out", str(out), *args],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}


def _mirror_url(log: list[str]) -> str | None:
    for line in list(log):
        if line.startswith("{") and json.loads(line).get("event") == "mirror serving":
            return str(json.loads(line)["url"])
    return None


def _model_yaml(name: str, source: str, pins: dict[str, str]) -> str:
    sha = "".join(f"\n      {file}: {digest}" for file, digest in pins.items())
    return f"""\
  - name: {name}
    source: {source}
    sha256:{sha}
    profiles:
      - engine: vllm
        args: [--max-model-len, "512"]
        # 1 GiB of KV cache: vLLM's CPU default takes a share of the machine's memory.
        env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
"""


def _replicas(fleet_admin: str, model: str) -> list[dict[str, Any]]:
    return [r for r in _get(f"{fleet_admin}/api/v1/replicas") or [] if r["model"] == model]


def _state(admin: str, outputs: dict[str, list[str]]) -> str:
    lines = [json.dumps(_get(f"{admin}/api/v1/nodes"))]
    lines += [json.dumps(r) for r in _get(f"{admin}/api/v1/replicas") or []]
    lines += [f"--- {name}:\n" + "\n".join(out[-30:]) for name, out in outputs.items()]
    return "\n".join(lines)


def _ready_endpoint(admin: str, model: str) -> str | None:
    return next((r["endpoint"] for r in _replicas(admin, model) if r["state"] == "ready"), None)


def _was_ready(log: list[str], model: str) -> bool:
    for line in list(log):
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "shard status" and (event.get("model"), event.get("state")) == (
                model,
                "ready",
            ):
                return True
    return False


def _first_token(gateway: str) -> None:
    """Stream a chat of CHAT until its first token comes back."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="none")
    with client:
        stream = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stream.close()
                return


@pytest.fixture(scope="module")
def fleet(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Mirror, server and agent running; yields once CHAT and HEADS each have a ready replica."""
    tmp = tmp_path_factory.mktemp("fleet")
    pki_dir = tmp / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1"], pki_dir)
    pki.issue_agent(pki_dir, NODE, pki_dir)
    root = tmp / "mirror"
    pins = {
        CHAT: _tiny_model(root / "tiny"),
        HEADS: _tiny_model(root / "heads", "--heads", "4", "--head-dim", "16"),
    }
    outputs: dict[str, list[str]] = {"mirror": [], "server": [], "agent": []}
    processes: list[subprocess.Popen[str]] = []
    try:
        (tmp / "mirror.yaml").write_text(f"listen: 127.0.0.1:0\nroot: {root}\n")
        processes.append(_llmgw(["--role=mirror", "--config", str(tmp / "mirror.yaml")], outputs["mirror"]))
        mirror = _until("the mirror to serve", lambda: _mirror_url(outputs["mirror"]), WAIT_S, lambda: "")
        models = _model_yaml(CHAT, f"{mirror}/files/tiny/", pins[CHAT])
        models += _model_yaml(HEADS, f"{mirror}/files/heads/", pins[HEADS])
        server_yaml = tmp / "server.yaml"
        server_yaml.write_text(
            f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
state_dir: {tmp / "server"}
auth: {{enabled: false}}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / "server.pem"}
  key: {pki_dir / "server-key.pem"}
control:
  interval_s: 0.5
  # A replica that fails stays failed, for the test to read why, rather than being tried again.
  base_backoff_s: 3600
engines:
  vllm: "{VERSION}"
models:
{models}"""
        )
        marker_before = (INSTALLED / MARKER).read_text()
        started = time.monotonic()
        processes.append(_llmgw(["--role=server", "--config", str(server_yaml)], outputs["server"]))
        listening = _until(
            "the server to listen",
            lambda: bound.read(tmp / "server"),
            WAIT_S,
            lambda: "\n".join(outputs["server"][-30:]),
        )
        agent_state = tmp / "agent"
        (tmp / "agent.yaml").write_text(
            f"""\
node_id: {NODE}
servers: ["127.0.0.1:{listening.agent_port}"]
state_dir: {agent_state}
heartbeat_interval_s: 0.5
ready_timeout_s: {READY_WITHIN_S}
keep_engines_on_stop: false
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / f"{NODE}.pem"}
  key: {pki_dir / f"{NODE}-key.pem"}
provision:
  # The cache the real-engine tests share: vLLM is found installed there, never installed twice.
  dir: {ENGINES}
engines:
  vllm:
    # PyPI and this machine's pip find-links (torch's CPU wheel); PyTorch's own index is unreachable.
    index_url: {INDEX}
"""
        )
        processes.append(_llmgw(["--role=agent", "--config", str(tmp / "agent.yaml")], outputs["agent"]))
        admin, gateway = f"http://{listening.admin}", f"http://{listening.gateway}"
        _until(
            f"{CHAT} to have a ready replica",
            lambda: _ready_endpoint(admin, CHAT),
            READY_WITHIN_S,
            lambda: _state(admin, outputs),
        )
        # From the server's log, not its replicas now: HEADS's engine may die at once once ready.
        _until(
            f"{HEADS}'s replica to have been ready",
            lambda: _was_ready(outputs["server"], HEADS),
            READY_WITHIN_S,
            lambda: _state(admin, outputs),
        )
        _first_token(gateway)
        fleet = Fleet(
            gateway=gateway,
            admin=admin,
            server_yaml=server_yaml,
            agent_state=agent_state,
            marker_before=marker_before,
            first_token_s=time.monotonic() - started,
            outputs=outputs,
        )
        print(
            f"\nfrom the server's start ({CHAT} in its catalog) to its first token: "
            f"{fleet.first_token_s:.0f} s"
        )
        yield fleet
    finally:
        # The agent first: it stops its engines (keep_engines_on_stop: false) before the server goes.
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                # Its reader thread ends at end of file; the pipe is the test's to close.
                process.stdout.close()


def test_the_agent_provisions_vllm_from_its_cache_without_installing_it_again(fleet: Fleet) -> None:
    nodes = _get(f"{fleet.admin}/api/v1/nodes")
    (node,) = [n for n in nodes if n["id"] == NODE]
    (install,) = [p for p in node["provision"] if p["engine"] == "vllm"]
    assert (install["version"], install["variant"], install["state"]) == (VERSION, "cpu", "ready"), install
    assert install["detail"] == f"vllm {VERSION}"
    assert "vllm" in node["engines"]
    assert (INSTALLED / MARKER).read_text() == fleet.marker_before, "the agent installed vLLM again"


def test_each_model_is_placed_on_the_node_and_runs_on_weights_fetched_from_the_mirror(fleet: Fleet) -> None:
    (replica,) = _replicas(fleet.admin, CHAT)
    assert (replica["node"], replica["engine"], replica["state"]) == (NODE, "vllm", "ready"), replica
    # By its port: other tests' vLLMs may serve a model of the same name on this machine.
    port = replica["endpoint"].rsplit(":", 1)[1]
    (argv,) = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and SERVER_MODULE in p.info["cmdline"] and port in p.info["cmdline"]
    ]
    assert argv[0] == str(INSTALLED / "bin" / "python")
    weights = Path(argv[argv.index("--model") + 1])
    assert weights.is_relative_to(fleet.agent_state / "weights")
    # Every file of each directory, each checked against its pin before the marker was written.
    for name in ("tiny", "heads"):
        (copy,) = (fleet.agent_state / "weights").glob(f"{name}-*")
        assert (copy / ".complete.json").is_file()
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in copy.iterdir()}


def test_the_openai_client_gets_a_chat_and_a_stream_with_the_engines_own_usage(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="none")
    with client:
        reply = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
        )
        assert reply.model == CHAT
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 0 and 1 <= reply.usage.completion_tokens <= 8

        stream = client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
    assert text
    assert usage is not None and usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 8


def test_ctl_metrics_prints_the_engines_own_vllm_metrics(fleet: Fleet) -> None:
    (replica,) = _replicas(fleet.admin, CHAT)
    done = _ctl(fleet.server_yaml, "metrics", replica["shard_id"])
    assert done.returncode == 0, done.stderr
    names = [line.split("{")[0].split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert "vllm:num_requests_running" in names, done.stdout
    assert any(n.startswith("vllm:generation_tokens") for n in names), done.stdout


def test_a_reply_through_the_gateway_is_the_engines_own_and_what_the_gateway_adds_is_measured(
    fleet: Fleet,
) -> None:
    """The same request to the engine and through the gateway gets the same text; the times are printed."""
    endpoint = _ready_endpoint(fleet.admin, CHAT)
    (record,) = [r for r in read_state(fleet.agent_state) if r.request.model == CHAT]
    direct_headers = {"Authorization": f"Bearer {record.request.engine_secret}"}
    body = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    texts: dict[str, set[str]] = {"direct": set(), "gateway": set()}
    for _ in range(30):
        for way, url, headers in (
            ("direct", f"{endpoint}/v1/chat/completions", direct_headers),
            ("gateway", f"{fleet.gateway}/v1/chat/completions", {}),
        ):
            began = time.perf_counter()
            status, reply = _post(url, body, headers)
            times[way].append(time.perf_counter() - began)
            assert status == 200, reply
            texts[way].add(reply["choices"][0]["message"]["content"])
    assert texts["gateway"] == texts["direct"]
    p50 = {way: statistics.median(t) * 1000 for way, t in times.items()}
    print(
        f"\nconcurrency 1, {len(times['direct'])} requests each: direct p50 {p50['direct']:.1f} ms, "
        f"through the gateway p50 {p50['gateway']:.1f} ms, added {p50['gateway'] - p50['direct']:.1f} ms"
    )


# Last: it kills HEADS's engine, and the tests above need the fleet whole.
def test_an_engine_that_dies_after_it_was_healthy_is_explained_in_its_own_words(fleet: Fleet) -> None:
    status, reply = _post(
        f"{fleet.gateway}/v1/chat/completions",
        {"model": HEADS, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
    )
    assert status >= 500, reply

    # Its replica is failed for a moment, then stopped and its node backs off: the 503 says why either way.
    def said_in_503() -> tuple[int, Any] | None:
        answer = _post(
            f"{fleet.gateway}/v1/chat/completions",
            {"model": HEADS, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
        )
        return answer if answer[0] == 503 and HEAD_DIM_16 in json.dumps(answer[1]) else None

    _until(
        f"the gateway's 503 for {HEADS} to say why its engine died",
        said_in_503,
        WAIT_S,
        lambda: _state(fleet.admin, fleet.outputs),
    )

    explained = _ctl(fleet.server_yaml, "explain", HEADS)
    assert explained.returncode == 0, explained.stderr
    assert HEAD_DIM_16 in explained.stdout, explained.stdout
