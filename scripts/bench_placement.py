"""How long placement takes: 1,000 replicas over 5,000 simulated nodes (a benchmark, not a test).

The target: 4,000 replicas over 20,000 nodes in at most a second
(`--nodes 20000 --replicas 4000`).

The reconciler places on the event loop, so a pass over a large cluster must
stay well under a second. The cluster: H100 nodes on 50 fabrics, A100 nodes,
CPU nodes, some unreachable, cordoned or still installing llama.cpp, in two
zones; the catalog: 100 models of 10 replicas each, a mix of GPU, CPU with a
memory floor, labelled and 2-node profiles, each with a fallback profile.

    .venv/bin/python scripts/bench_placement.py [--nodes 5000] [--replicas 1000] [--policy spread]
"""

from __future__ import annotations

import argparse
import random
import time

from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control.inventory import Node
from llmgw.control.placement import Scheduler
from llmgw.proto.llmgw import v1 as pb


def simulated_nodes(count: int, rng: random.Random) -> list[Node]:
    nodes = []
    for i in range(count):
        kind = i % 10
        if kind < 4:
            gpus = [pb.Gpu(index=g, gpu_class="h100-80g", healthy=rng.random() > 0.01) for g in range(8)]
            fabrics = [pb.Fabric(name=f"ib-{i % 50}")]
        elif kind < 7:
            gpus = [pb.Gpu(index=g, gpu_class="a100-40g", healthy=True) for g in range(4)]
            fabrics = []
        else:
            gpus, fabrics = [], []
        engines = {"sim": "builtin", "llamacpp": "b6500", "vllm": "0.11"}
        provision = []
        if rng.random() < 0.02:
            del engines["llamacpp"]
            provision = [
                pb.ProvisionStatus(
                    engine="llamacpp",
                    version="b6500",
                    state="installing",
                    detail="downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)",
                )
            ]
        nodes.append(
            Node(
                id=f"node-{i:05d}",
                state="unreachable" if rng.random() < 0.01 else "ready",
                admin_state="cordoned" if rng.random() < 0.01 else "ready",
                engine_versions=engines,
                engines_probed=True,
                gpus=gpus,
                memory=pb.Memory(total_mb=rng.choice((128_000, 256_000, 512_000)), available_mb=0),
                labels={"zone": "eu" if i % 2 else "us"},
                fabrics=fabrics,
                provision=provision,
            )
        )
    for n in nodes:
        # As the inventory does when a node registers (Node.facts), not on every pass.
        n.facts()
    return nodes


def catalog(replicas: int) -> list[ModelConfig]:
    shapes = [
        [ProfileConfig(name="h100", engine="vllm", gpu_class="h100-80g", gpus_per_node=2)],
        [ProfileConfig(name="a100", engine="llamacpp", gpu_class="a100-40g", gpus_per_node=1)],
        [ProfileConfig(name="cpu", engine="llamacpp", min_memory_mb=64_000)],
        [
            ProfileConfig(
                name="eu", engine="vllm", gpu_class="h100-80g", gpus_per_node=4, labels={"zone": "eu"}
            )
        ],
        [ProfileConfig(name="pair", engine="vllm", gpu_class="h100-80g", gpus_per_node=8, nodes=2)],
    ]
    fallback = ProfileConfig(name="cpu-fallback", engine="llamacpp", min_memory_mb=32_000)
    per_model = 10
    return [
        ModelConfig(name=f"model-{m:03d}", replicas=per_model, profiles=[*shapes[m % len(shapes)], fallback])
        for m in range(replicas // per_model)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--policy", choices=("spread", "binpack"), default="spread")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    nodes = simulated_nodes(args.nodes, random.Random(args.seed))
    models = catalog(args.replicas)

    started, cpu = time.perf_counter(), time.process_time()
    scheduler = Scheduler(nodes, [], models, args.policy)
    placed = shards = 0
    for model in models:
        for _ in range(model.replicas):
            placement = scheduler.place(model)
            if placement is not None:
                placed += 1
                shards += len(placement.ranks)
    placing_s = time.perf_counter() - started
    placing_cpu_s = time.process_time() - cpu

    started = time.perf_counter()
    verdicts = scheduler.explain(models[0])
    explain_s = time.perf_counter() - started

    print(
        f"nodes: {args.nodes}, replicas asked for: {sum(m.replicas for m in models)}, policy: {args.policy}"
    )
    # CPU time too: on a busy machine the wall clock says more about the neighbours.
    print(
        f"placed {placed} replicas ({shards} shards) in {placing_s * 1000:.0f} ms "
        f"({placing_cpu_s * 1000:.0f} ms of CPU)"
    )
    print(f"explained {models[0].name} ({len(verdicts)} verdicts) in {explain_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
