"""server.yaml's models are held to what `llmgw ctl model add` holds a model to, before the server starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.catalog import load_server_config
from llmgw.cli.exit import EXIT_CONFIG
from llmgw.cli.main import main
from llmgw.errors import ConfigError

GOOD = """\
listen: 127.0.0.1:0
models:
  - name: sim-chat
    profiles:
      - engine: sim
"""


@pytest.mark.parametrize(
    ("model", "error"),
    [
        (
            "  - name: m\n    profiles:\n      - engine: vlm\n",
            "server.yaml:8: 'models[1].profiles[0].engine' is 'vlm'; "
            "expected one of llamacpp, sglang, sim, vllm",
        ),
        ("  - name: m\n    replicas: 1\n", "server.yaml:6: m has no profile; add one under 'profiles'"),
        (
            "  - name: m\n    source: s3://bucket/m.gguf\n    profiles:\n      - engine: sim\n",
            "server.yaml:7: 'models[1].source' is 's3://bucket/m.gguf'; expected a file or directory on the "
            "server (/srv/models/model.gguf, file:///srv/models/Qwen2.5-0.5B), `mirror:ORG/MODEL[@REVISION]`",
        ),
        ("  - profiles:\n      - engine: sim\n", "server.yaml:6: models[1] has no 'name'"),
        (
            '  - name: "../../../escape"\n    profiles:\n      - engine: sim\n',
            "server.yaml:6: the model name '../../../escape' is not allowed; a model name is letters",
        ),
        (
            "  - name: m\n    profiles:\n      - engine: sim\n        name: ../p\n",
            "server.yaml:9: the profile name '../p' is not allowed",
        ),
        (
            "  - name: m\n    source: https://h/w/..\n    profiles:\n      - engine: sim\n",
            "server.yaml:7: 'models[1].source' is 'https://h/w/..', which names no file",
        ),
        (
            "  - name: m\n    profiles:\n      - engine: sim\n        args: [--port, '8080']\n",
            "server.yaml:9: 'models[1].profiles[0].args': the agent chooses the port from "
            "agent.yaml's engine_ports; remove --port 8080 from args",
        ),
    ],
)
def test_a_bad_model_in_server_yaml_is_refused_saying_what_and_where(
    tmp_path: Path, model: str, error: str
) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(GOOD + model)
    with pytest.raises(ConfigError) as refused:
        load_server_config(path)
    assert str(refused.value).startswith(f"{tmp_path}/{error}")


def test_a_good_server_yaml_loads_with_its_models(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(GOOD)
    assert [m.name for m in load_server_config(path).models] == ["sim-chat"]


def test_the_server_does_not_start_on_a_misspelt_engine_and_exits_with_the_config_code(
    tmp_path: Path,
) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(GOOD + "  - name: m\n    profiles:\n      - engine: vlm\n")
    result = CliRunner().invoke(main, ["--role=server", "--config", str(path)])
    assert result.exit_code == EXIT_CONFIG
    assert f"{path}:8: 'models[1].profiles[0].engine' is 'vlm'" in result.output
