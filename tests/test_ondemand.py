"""How long a request for an on-demand model is held while it starts, when the model does not say."""

from __future__ import annotations

import pytest

from llmgw.config import ModelConfig, ProfileConfig, ScaleConfig, TimeoutsConfig
from llmgw.ondemand import cold_start_bound_s


def _model(*engines: str, cold_start_s: float = 0.0) -> ModelConfig:
    return ModelConfig(
        name="m",
        scale=ScaleConfig(min=0, max=1),
        profiles=[ProfileConfig(name=f"p{i}", engine=e) for i, e in enumerate(engines)],
        timeouts=TimeoutsConfig(cold_start_s=cold_start_s),
    )


@pytest.mark.parametrize(
    ("engines", "held_s"),
    [(("llamacpp",), 120.0), (("sim",), 120.0), (("vllm",), 900.0), (("sglang",), 900.0)],
)
def test_a_model_that_sets_no_bound_is_held_as_long_as_its_engine_takes_to_start(
    engines: tuple[str, ...], held_s: float
) -> None:
    assert cold_start_bound_s(_model(*engines)) == held_s


def test_a_model_with_several_profiles_is_held_as_long_as_its_slowest_engine_takes() -> None:
    # Its replica may start on the vLLM profile when no node takes the llama.cpp one.
    assert cold_start_bound_s(_model("llamacpp", "vllm")) == 900.0


def test_the_models_own_bound_is_kept_whatever_its_engines() -> None:
    assert cold_start_bound_s(_model("llamacpp", "vllm", cold_start_s=45.0)) == 45.0
