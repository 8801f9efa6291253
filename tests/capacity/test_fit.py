"""A fleet of fake nodes where some fit: each node judged, and the sentence that says where and why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.capacity.fleet import Card, NodeCapacity, ProfileShape
from llmgw.capacity.plan import make_plan
from llmgw.capacity.shape import ModelShape, WeightsFile

GIB = 1 << 30


def shape(weights: int = 14 * 10**9) -> ModelShape:
    """An 8B-ish model: 32 layers, 8 KV heads of 128 (128 KiB of f16 cache a token)."""
    return ModelShape(
        source="m.gguf",
        format="gguf",
        architecture="llama",
        files=(WeightsFile(path="m.gguf", bytes=weights, quantisation="F16 100%"),),
        layers=32,
        k_per_token=32 * 8 * 128,
        v_per_token=32 * 8 * 128,
        dtype_bytes=2,
        context_length=8192,
    )


def node(name: str, *cards: tuple[str, int, int], ram_mb: int | None = 64 * 1024, **kw: bool) -> NodeCapacity:
    return NodeCapacity(
        id=name,
        ready=True,
        state="ready",
        cards=[
            Card(
                index=i,
                gpu_class=cls,
                memory_total_mb=total,
                memory_used_mb=used,
                healthy=True,
                claimed=kw.get("claimed", False),
            )
            for i, (cls, total, used) in enumerate(cards)
        ],
        memory_total_mb=ram_mb,
        memory_available_mb=ram_mb,
        engines=["llamacpp"],
        labels={},
    )


FLEET = [
    node("h1", ("h100-80g", 81920, 0), ("h100-80g", 81920, 0)),
    node("h2", ("h100-80g", 81920, 70000)),
    node("l4", ("l4-24g", 23034, 0)),
    node("n7", ("a4000-16g", 16376, 0)),
    node("cpu", ram_mb=16 * 1024),
]


def profile(**kw: object) -> ProfileShape:
    fields: dict[str, object] = {
        "name": "gpu",
        "engine": "llamacpp",
        "gpu_class": "",
        "gpus_per_node": 1,
        "nodes": 1,
        "min_memory_mb": 0,
        "args": [],
    }
    return ProfileShape(**{**fields, **kw})  # type: ignore[arg-type]


def test_a_profile_fits_the_nodes_whose_cards_hold_it_and_names_what_the_others_lack():
    plan = make_plan(shape(), [profile()], FLEET, context=8192, parallel=4)
    (fit,) = plan.profiles
    verdicts = {n.node: (n.fits, n.reason) for n in fit.nodes}
    # 14 GB of weights + 4 GiB of cache + overhead: about 19.3 GB per card.
    assert fit.per_card_bytes == pytest.approx(19.3e9, rel=0.01)
    assert verdicts["h1"][0] and not verdicts["h2"][0]
    assert verdicts["h2"][1] == "has 12.5 GB free"
    assert verdicts["n7"] == (False, "has 17.2 GB free")
    assert verdicts["cpu"] == (False, "has no GPU")
    assert fit.summary == (
        "needs 19.3 GB of GPU memory per card at context 8192 × 4; fits on h1, l4; "
        "h2 has 12.5 GB free; n7 has 17.2 GB free; cpu has no GPU"
    )
    assert plan.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2


def test_a_smaller_context_fits_more_nodes():
    fit = make_plan(shape(), [profile()], FLEET, context=1024, parallel=1).profiles[0]
    assert [n.node for n in fit.nodes if n.fits] == ["h1", "l4", "n7"]


def test_a_replica_over_two_cards_needs_half_on_each_and_two_free_cards():
    fit = make_plan(shape(40 * 10**9), [profile(gpus_per_node=2)], FLEET, context=8192).profiles[0]
    verdicts = {n.node: (n.fits, n.reason) for n in fit.nodes}
    assert fit.cards == 2 and fit.per_card_bytes < 25e9
    assert verdicts["h1"][0] and verdicts["h1"][1].startswith("fits on 2 of its 2 free card(s)")
    assert verdicts["h2"] == (False, "has 1 free GPU(s) of 1, 2 needed")


def test_a_profile_of_a_gpu_class_rules_out_other_classes_by_name():
    fit = make_plan(shape(), [profile(gpu_class="l4-24g")], FLEET, context=1024).profiles[0]
    verdicts = {n.node: (n.fits, n.reason) for n in fit.nodes}
    assert verdicts["l4"][0]
    assert verdicts["h1"] == (False, "has no l4-24g GPU")


def test_cards_that_replicas_hold_are_not_offered():
    busy = [node("h1", ("h100-80g", 81920, 0), claimed=True)]
    fit = make_plan(shape(), [profile()], busy, context=1024).profiles[0]
    assert fit.nodes[0].reason == "has 0 free GPU(s) of 1, 1 needed"


def test_a_cpu_profile_needs_it_all_in_free_ram():
    fit = make_plan(shape(4 * 10**9), [profile(gpus_per_node=0, name="cpu")], FLEET, context=2048).profiles[0]
    verdicts = {n.node: n.fits for n in fit.nodes}
    assert verdicts == {"h1": True, "h2": True, "l4": True, "n7": True, "cpu": True}
    tight = [node("small", ram_mb=2048)]
    small = make_plan(shape(4 * 10**9), [profile(gpus_per_node=0)], tight, context=2048).profiles[0]
    assert small.nodes[0].reason == "has 2.1 GB of RAM free"


def test_without_a_profile_each_node_is_judged_on_the_fewest_cards_that_hold_it(tmp_path: Path):
    fit = make_plan(shape(30 * 10**9), [], FLEET, context=4096).profiles[0]
    verdicts = {n.node: (n.fits, n.reason) for n in fit.nodes}
    assert fit.profile == "(any)" and fit.engine == "llamacpp"
    assert verdicts["h1"] == (True, "fits on 1 of its 2 free h100-80g card(s), 32.3 GB each")
    assert verdicts["cpu"] == (False, "has 17.2 GB of RAM free")


def test_the_profiles_own_context_and_slots_are_read_from_its_llama_server_arguments():
    fit = make_plan(shape(), [profile(args=["-c", "16384", "-np", "4"])], FLEET).profiles[0]
    assert (fit.estimate.context, fit.estimate.parallel) == (4096, 4)


def small(weights: int = 10**9) -> ModelShape:
    return ModelShape(
        source="hf",
        format="safetensors",
        architecture="LlamaForCausalLM",
        files=(WeightsFile(path="hf/model.safetensors", bytes=weights, quantisation="BF16 100%"),),
        layers=2,
        k_per_token=2 * 64,
        v_per_token=2 * 64,
        dtype_bytes=2,
        context_length=4096,
    )


def test_vllm_on_a_card_needs_the_share_of_it_that_its_memory_utilization_takes():
    # 44.0 GB free of 85.9 GB: the estimate (a few GB) fits, but vLLM takes 92% of the card at start.
    half = node("half", ("h100-80g", 81920, 40000))
    (fit,) = make_plan(small(), [profile(engine="vllm")], [half]).profiles
    (verdict,) = fit.nodes
    assert (verdict.fits, verdict.reason) == (
        False,
        "has 44.0 GB free, and vLLM takes 92% of its 85.9 GB (79.0 GB)",
    )
    assert "vLLM takes 92% of each card's memory at start (--gpu-memory-utilization 0.92)" in fit.summary
    args = ["--gpu-memory-utilization", "0.4"]
    (fit,) = make_plan(small(), [profile(engine="vllm", args=args)], [half]).profiles
    assert fit.nodes[0].fits and fit.estimate.claim == 0.4


def test_vllm_on_a_cpu_takes_its_share_of_the_node_unless_the_profile_sets_the_cache():
    busy = NodeCapacity(
        id="busy",
        ready=True,
        state="ready",
        cards=[],
        memory_total_mb=64 * 1024,
        memory_available_mb=16 * 1024,
        engines=["vllm"],
        labels={},
    )
    cpu = profile(engine="vllm", gpus_per_node=0)
    (fit,) = make_plan(small(), [cpu], [busy]).profiles
    assert (fit.nodes[0].fits, fit.nodes[0].reason) == (
        False,
        "has 17.2 GB of RAM free, and vLLM takes 92% of its 68.7 GB (63.2 GB)",
    )
    spaced = profile(engine="vllm", gpus_per_node=0, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    (fit,) = make_plan(small(), [spaced], [busy]).profiles
    # 1 GiB of cache at 512 bytes a token, whatever the context asked.
    assert (fit.estimate.kv_bytes, fit.estimate.kv_tokens, fit.estimate.claim) == (GIB, 2097152, 0.0)
    assert fit.nodes[0].fits
    assert "its KV cache is set to 1.1 GB: 2,097,152 tokens, 512 sequence(s) of 4,096 at once" in fit.summary


def test_vllm_and_sglang_are_planned_for_the_sequences_the_agent_has_them_serve():
    plans = make_plan(
        small(),
        [
            profile(name="v", engine="vllm"),
            profile(name="v16", engine="vllm", args=["--max-num-seqs", "16"]),
            profile(name="s", engine="sglang"),
            profile(name="l", engine="llamacpp"),
        ],
        FLEET,
    )
    assert [(p.profile, p.estimate.parallel) for p in plans.profiles] == [
        ("v", 4),
        ("v16", 16),
        ("s", 4),
        ("l", 1),
    ]
