"""The committed protocol code is what `make proto` generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.proto.llmgw import v1 as pb

ROOT = Path(__file__).parent.parent


def test_the_committed_proto_code_is_not_stale(tmp_path: Path) -> None:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "protos"),
            f"--python_betterproto_out={tmp_path}",
            str(ROOT / "protos/llmgw/v1/agent.proto"),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    fresh = (tmp_path / "llmgw/v1/__init__.py").read_text()
    committed = (ROOT / "src/llmgw/proto/llmgw/v1/__init__.py").read_text()
    assert fresh == committed, "src/llmgw/proto is stale: run `make proto` and commit the result"


# What the architecture and the reference promise the stream carries (issue 2, "the protocol").
MESSAGE_SET = {
    "AgentMessage": {"register", "heartbeat", "shard", "logs"},
    "ControlMessage": {"start", "stop", "drain", "ack", "remove_weights", "provision", "logs"},
    "Register": {
        "node_id",
        "host",
        "gpus",
        "memory",
        "engine_versions",
        "engines_probed",
        "running",
        "weights",
        "storage",
        "fabrics",
        "provision",
        # Across hosts: where the node's engines are reached, and rank 0 on its fabric.
        "advertise_address",
        "fabric_address",
    },
    "Heartbeat": {
        "sequence",
        "memory",
        "gpus_changed",
        "gpus",
        "weights_changed",
        "weights",
        "storage_changed",
        "storage",
        "engines_changed",
        "engine_versions",
        "provision_changed",
        "provision",
    },
    "ShardStatus": {
        "shard_id",
        "model",
        "engine",
        "state",
        "endpoint",
        "detail",
        "last_output",
        "pid",
        "engine_secret",
    },
    "StartShard": {"shard_id", "model", "engine", "args", "env", "source", "sha256", "engine_secret"},
    "StopShard": {"shard_id", "reason"},
    "DrainShard": {"shard_id", "timeout_ms"},
    "RemoveWeights": {"sources"},
    "Provision": {"engines", "base_url", "checksums"},
    "EngineWant": {"engine", "version"},
    "ProvisionStatus": {"engine", "version", "state", "detail"},
    "LogsRequest": {"request_id", "source", "lines"},
    "LogsReply": {"request_id", "lines", "sources", "error"},
    "Ack": {"ref", "ok", "error"},
}


@pytest.mark.parametrize("message", sorted(MESSAGE_SET))
def test_the_protocol_carries_the_whole_message_set(message: str) -> None:
    fields = set(getattr(pb, message).__dataclass_fields__)
    assert MESSAGE_SET[message] <= fields, f"{message} lacks {sorted(MESSAGE_SET[message] - fields)}"


def test_every_changed_flag_of_a_heartbeat_comes_with_the_list_it_vouches_for() -> None:
    """An empty list means "none" only when its flag says it changed; a flag without its list is useless."""
    fields = set(pb.Heartbeat.__dataclass_fields__)
    flags = {f.removesuffix("_changed") for f in fields if f.endswith("_changed")}
    assert {"gpus", "weights", "storage", "engines", "provision"} <= flags
    lists = {"engines": "engine_versions"}
    assert all(lists.get(flag, flag) in fields for flag in flags)
