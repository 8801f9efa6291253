"""Which build of llama.cpp a machine gets (its recipe, in engines/llamacpp.py)."""

from __future__ import annotations

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.engines.base import UnsupportedError
from llmgw.engines.llamacpp import LlamaCppEngine, choose_build

X64 = Host(os_id="ubuntu", id_like=("debian",), arch="amd64", cpu_flags=("avx2",))


class TestTheBuildFollowsTheHardware:
    def test_an_x64_node_without_a_driver_gets_the_cpu_build(self) -> None:
        build = choose_build("b10991", X64)

        assert build.variant == "cpu"
        assert build.assets == ("llama-b10991-bin-ubuntu-x64.tar.gz",)
        assert build.binary == "llama-server"
        assert build.cpu_flags == ("avx2",)
        assert dict(build.packages) == {"deb": ("libgomp1",), "rpm": ("libgomp",)}

    def test_an_x64_node_with_an_nvidia_driver_gets_the_cuda_build_and_its_runtime(self) -> None:
        build = choose_build("b10991", Host(arch="amd64", nvidia_driver="570.86.15"))

        assert build.variant == "cuda-12.8"
        assert build.assets == (
            "llama-b10991-bin-ubuntu-cuda-12.8-x64.tar.gz",
            "cudart-llama-b10991-bin-ubuntu-cuda-12.8-x64.tar.gz",
        )

    def test_an_arm64_node_gets_the_cpu_build_even_with_a_driver(self) -> None:
        build = choose_build("b10991", Host(arch="arm64", nvidia_driver="570.86.15"))

        assert (build.variant, build.assets) == ("cpu", ("llama-b10991-bin-ubuntu-arm64.tar.gz",))
        assert build.cpu_flags == ()

    @pytest.mark.parametrize("arch", ["riscv64", "ppc64el", ""])
    def test_any_other_architecture_is_unsupported_with_a_sentence(self, arch: str) -> None:
        with pytest.raises(UnsupportedError) as exc:
            choose_build("b10991", Host(arch=arch))

        assert str(exc.value) == f"llama.cpp publishes no Linux build for {arch or 'this architecture'}"


def test_its_recipe_names_the_repository_that_publishes_the_builds() -> None:
    recipe = LlamaCppEngine.recipe
    assert recipe is not None
    assert (recipe.repo, recipe.choose) == ("ggml-org/llama.cpp", choose_build)
