"""The scheduler: one reason per node and profile, fabrics, spread and binpack, claims accounted."""

from __future__ import annotations

import asyncio
import heapq
import random
from typing import Any

import pytest

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ScaleConfig, ServerConfig
from llmgw.control.inventory import Inventory, Node, Replica
from llmgw.control.placement import Backoff, Rank, Scheduler, Verdict, explain
from llmgw.control.reconciler import Reconciler
from llmgw.control.records import Weights
from llmgw.proto.llmgw import v1 as pb

H100 = "h100-80g"
A100 = "a100-40g"


def gpus(n: int, gpu_class: str = H100, unhealthy: dict[int, str] | None = None) -> list[pb.Gpu]:
    sick = unhealthy or {}
    return [
        pb.Gpu(index=i, gpu_class=gpu_class, healthy=i not in sick, unhealthy_reason=sick.get(i, ""))
        for i in range(n)
    ]


def node(node_id: str, **fields: Any) -> Node:
    fields.setdefault("engine_versions", {"sim": "builtin", "llamacpp": "b6500"})
    fields.setdefault("engines_probed", True)
    fabrics = fields.pop("fabrics", ())
    return Node(id=node_id, fabrics=[pb.Fabric(name=f) for f in fabrics], **fields)


def memory(total_mb: int) -> pb.Memory:
    return pb.Memory(total_mb=total_mb, available_mb=total_mb)


def profile(**fields: Any) -> ProfileConfig:
    fields.setdefault("engine", "llamacpp")
    fields.setdefault("name", "p")
    return ProfileConfig(**fields)


def model(*profiles: ProfileConfig, name: str = "m", replicas: int = 1) -> ModelConfig:
    return ModelConfig(name=name, replicas=replicas, profiles=list(profiles))


def only(verdicts: list[Verdict]) -> Verdict:
    (verdict,) = verdicts
    return verdict


# What a person sets so that nodes have llama.cpp: said where no node was asked to install it.
HOW = (
    'set server.yaml `engines: {llamacpp: "b11434"}` for every node to install it, '
    "or agent.yaml `engines.llamacpp.binary` to a build of your own"
)

REJECTIONS = [
    pytest.param(node("n1", state="unreachable"), profile(), "is unreachable", id="unreachable"),
    pytest.param(node("n1", connected=False), profile(), "is not connected", id="disconnected"),
    pytest.param(node("n1", admin_state="cordoned"), profile(), "is cordoned", id="cordoned"),
    pytest.param(node("n1", admin_state="draining"), profile(), "is draining", id="draining"),
    pytest.param(
        node("n1", engine_versions={"sim": "builtin"}),
        profile(),
        "does not have llamacpp installed: " + HOW,
        id="engine-missing",
    ),
    pytest.param(
        node(
            "n1",
            engine_versions={"sim": "builtin"},
            provision=[
                pb.ProvisionStatus(
                    engine="llamacpp",
                    version="b10991",
                    state="installing",
                    detail="downloading llama-b10991-bin-ubuntu-x64.tar.gz (16 MB)",
                )
            ],
        ),
        profile(),
        "does not have llamacpp installed "
        "(installing: downloading llama-b10991-bin-ubuntu-x64.tar.gz (16 MB))",
        id="engine-installing",
    ),
    pytest.param(
        node("n1", gpus=gpus(4, A100)),
        profile(gpu_class=H100),
        f"has no {H100} GPU (it has 4 × {A100})",
        id="wrong-gpu-class",
    ),
    pytest.param(node("n1"), profile(gpus_per_node=1), "has no GPU (it has no GPU)", id="no-gpu"),
    pytest.param(
        node("n1", gpus=gpus(8, unhealthy={7: "XID 79: fell off the bus"})),
        profile(gpu_class=H100, gpus_per_node=8),
        f"has too few free {H100} GPUs (7 of 8 free, 8 needed); "
        "1 unhealthy (GPU 7: XID 79: fell off the bus)",
        id="too-few-cards",
    ),
    pytest.param(
        node("n1", memory=memory(16000)),
        profile(min_memory_mb=32000),
        "has too little memory (16000 MB free of 16000 MB, 32000 MB needed)",
        id="too-little-memory",
    ),
    pytest.param(node("n1"), profile(min_memory_mb=1), "has not reported its memory", id="memory-unknown"),
    pytest.param(
        node("n1", gpus=gpus(8)),
        profile(gpu_class=H100, gpus_per_node=8, nodes=2),
        "has no fabric, which a 2-node profile needs",
        id="no-fabric",
    ),
    pytest.param(node("n1"), profile(labels={"zone": "eu"}), "lacks the label zone=eu", id="missing-label"),
    pytest.param(
        node("n1", labels={"zone": "us"}),
        profile(labels={"zone": "eu"}),
        "has the label zone=us, not zone=eu",
        id="other-label",
    ),
]


class TestReasons:
    @pytest.mark.parametrize(("n", "p", "reason"), REJECTIONS)
    def test_a_node_that_cannot_take_the_profile_says_exactly_why(
        self, n: Node, p: ProfileConfig, reason: str
    ) -> None:
        verdict = only(explain(model(p), [n], []))
        assert (verdict.node, verdict.profile, verdict.candidate, verdict.reason) == (
            "n1",
            "p",
            False,
            reason,
        )

    @pytest.mark.parametrize(("n", "p", "reason"), REJECTIONS)
    def test_a_rejected_node_gets_no_replica(self, n: Node, p: ProfileConfig, reason: str) -> None:
        scheduler = Scheduler([n], [])
        assert scheduler.place(model(p)) is None
        # A lone node without the engine is summed up as the skeleton always said it.
        said = f"node n1 {reason}"
        if reason == "does not have llamacpp installed: " + HOW:
            said = "no node has the llamacpp engine: " + HOW
        if "(installing: " in reason:
            # Not a rejection but where the model is going: the install and its progress.
            said = "installing llamacpp b10991 on n1: downloading llama-b10991-bin-ubuntu-x64.tar.gz (16 MB)"
            assert scheduler.why_not(model(p)) == f"no node can run it until an engine is installed ({said})"
            return
        assert scheduler.why_not(model(p)) == f"no node can run it ({said})"

    def test_a_node_that_fits_is_a_candidate(self) -> None:
        n = node("n1", gpus=gpus(2), memory=memory(64000), labels={"zone": "eu"})
        p = profile(gpu_class=H100, gpus_per_node=2, min_memory_mb=32000, labels={"zone": "eu"})
        assert only(explain(model(p), [n], [])).candidate

    def test_every_node_is_judged_once_for_every_profile_in_order(self) -> None:
        nodes = [node("n1", gpus=gpus(1)), node("n2")]
        m = model(profile(name="gpu", gpu_class=H100), profile(name="cpu"))
        verdicts = explain(m, nodes, [])
        assert [(v.profile, v.node, v.candidate) for v in verdicts] == [
            ("gpu", "n1", True),
            ("gpu", "n2", False),
            ("cpu", "n1", True),
            ("cpu", "n2", True),
        ]

    def test_a_node_that_has_not_probed_its_engines_is_not_refused_for_one(self) -> None:
        # An agent too old to say which engines it has: refusing it would refuse every model.
        n = node("n1", engine_versions={}, engines_probed=False)
        assert only(explain(model(profile()), [n], [])).candidate

    def test_the_first_profile_some_node_can_take_is_used(self) -> None:
        m = model(profile(name="gpu", gpu_class=H100), profile(name="cpu"))
        placement = Scheduler([node("n1")], []).place(m)
        assert placement is not None and placement.profile.name == "cpu"


class TestWhyNot:
    def test_several_nodes_with_one_reason_are_counted(self) -> None:
        # The unreachable nodes have the class: a node the class rules out is never blamed for its state.
        unreachable = [node(f"n{i}", gpus=gpus(1), state="unreachable") for i in range(3)]
        nodes = [*unreachable, node("n9", gpus=gpus(1, A100))]
        why = Scheduler(nodes, []).why_not(model(profile(gpu_class=H100)))
        assert (
            why
            == f"no node can run it (3 nodes are not ready, node n9 has no {H100} GPU (it has 1 × {A100}))"
        )

    def test_each_profile_has_its_own_account(self) -> None:
        m = model(profile(name="gpu", gpu_class=H100), profile(name="cpu", labels={"zone": "eu"}))
        why = Scheduler([node("n1")], []).why_not(m)
        assert why == (
            "no node can run it (profile gpu: node n1 has no h100-80g GPU (it has no GPU); "
            "profile cpu: node n1 lacks the label zone=eu)"
        )


class TestFabrics:
    def test_a_multi_node_replica_is_placed_on_nodes_that_share_a_fabric(self) -> None:
        nodes = [
            node("a1", gpus=gpus(8), fabrics=["ib-a"]),
            node("b1", gpus=gpus(8), fabrics=["ib-b"]),
            node("b2", gpus=gpus(8), fabrics=["ib-b"]),
        ]
        p = profile(gpu_class=H100, gpus_per_node=8, nodes=2)
        placement = Scheduler(nodes, []).place(model(p))
        assert placement is not None and placement.fabric == "ib-b"
        assert [(r.node, r.gpu_indices) for r in placement.ranks] == [
            ("b1", tuple(range(8))),
            ("b2", tuple(range(8))),
        ]

    def test_a_multi_node_replica_is_refused_across_two_fabrics(self) -> None:
        nodes = [node("a1", gpus=gpus(8), fabrics=["ib-a"]), node("b1", gpus=gpus(8), fabrics=["ib-b"])]
        m = model(profile(gpu_class=H100, gpus_per_node=8, nodes=2))
        scheduler = Scheduler(nodes, [])
        assert scheduler.place(m) is None
        assert [v.reason for v in scheduler.explain(m)] == [
            "is on no fabric with the 2 candidate nodes a replica needs (ib-a has 1)",
            "is on no fabric with the 2 candidate nodes a replica needs (ib-b has 1)",
        ]

    def test_multi_node_replicas_go_where_an_exhaustive_search_puts_them(self) -> None:
        """Each fabric keeps its own heap; the choice is still the best over every fabric."""
        rng = random.Random(5)
        nodes = [
            node(
                f"n{i:03d}",
                gpus=gpus(rng.choice((4, 8)), unhealthy={0: "XID 79"} if i % 7 == 0 else None),
                fabrics=rng.sample(["ib-a", "ib-b", "ib-c", "ib-d"], rng.choice((1, 2))),
            )
            for i in range(24)
        ]
        pair = model(profile(gpu_class=H100, gpus_per_node=4, nodes=2), name="pair", replicas=30)
        single = model(profile(gpu_class=H100, gpus_per_node=2), name="single", replicas=30)
        backoff = {("pair", "n004"): Backoff(failures=1, remaining_s=5.0, cause="exited")}
        scheduler = Scheduler(nodes, [], [pair, single], backoff=backoff)
        reference = Scheduler(nodes, [], [pair, single], backoff=backoff)
        # Until neither fits any more: nodes placed on must come round again, fuller.
        for m in [pair, single] * 30:
            got = scheduler.place(m)
            want = _exhaustive(reference, m)
            assert (got and [(r.node, r.gpu_indices) for r in got.ranks]) == want


def _exhaustive(scheduler: Scheduler, m: ModelConfig) -> list[tuple[str, tuple[int, ...]]] | None:
    """Placement as it was done before fabric heaps: every pool member looked at for each replica."""
    [p] = m.profiles
    if p.nodes == 1:
        placement = scheduler.place(m)
        return placement and [(r.node, r.gpu_indices) for r in placement.ranks]
    states = scheduler._states
    by_fabric: dict[str, list[Any]] = {}
    for st in scheduler._pool(p).members:
        if st.fits(p) and (m.name, st.id) not in scheduler._backoff:
            for fabric in st.fabrics:
                by_fabric.setdefault(fabric, []).append(st)
    best = None
    for _, members in sorted(by_fabric.items()):
        if len(members) >= p.nodes:
            chosen = heapq.nsmallest(p.nodes, (st.key(scheduler._policy) for st in members))
            if best is None or chosen < best:
                best = chosen
    if best is None:
        return None
    return [(key[-1], scheduler._claim(states[key[-1]], p).gpu_indices) for key in best]


class TestPolicy:
    nodes = staticmethod(lambda: [node("n1", gpus=gpus(8)), node("n2", gpus=gpus(8))])
    m = model(profile(gpu_class=H100, gpus_per_node=2), replicas=2)

    def test_spread_puts_replicas_on_different_nodes(self) -> None:
        scheduler = Scheduler(self.nodes(), [], policy="spread")
        placed = [scheduler.place(self.m) for _ in range(2)]
        assert [p.ranks[0].node for p in placed if p] == ["n1", "n2"]

    def test_binpack_fills_one_node_before_the_next(self) -> None:
        scheduler = Scheduler(self.nodes(), [], policy="binpack")
        placed = [scheduler.place(self.m) for _ in range(5)]
        assert [(p.ranks[0].node, p.ranks[0].gpu_indices) for p in placed if p] == [
            ("n1", (0, 1)),
            ("n1", (2, 3)),
            ("n1", (4, 5)),
            ("n1", (6, 7)),
            ("n2", (0, 1)),
        ]

    def test_binpack_prefers_the_node_already_in_use(self) -> None:
        running = [Replica("s1", "m", "n2", "llamacpp", "ready", profile="p", gpu_indices=[0, 1])]
        scheduler = Scheduler(self.nodes(), running, [self.m], policy="binpack")
        placed = scheduler.place(self.m)
        assert placed is not None and placed.ranks[0] == Rank("n2", (2, 3))


class TestClaims:
    def test_cards_held_by_running_replicas_are_not_offered_again(self) -> None:
        m = model(profile(gpu_class=H100, gpus_per_node=4))
        running = [Replica("s1", "m", "n1", "llamacpp", "ready", profile="p", gpu_indices=[0, 1, 2, 3])]
        scheduler = Scheduler([node("n1", gpus=gpus(8))], running, [m])
        first = scheduler.place(m)
        assert first is not None and first.ranks[0].gpu_indices == (4, 5, 6, 7)
        assert scheduler.place(m) is None
        assert scheduler.why_not(m) == (
            f"no node can run it (node n1 has too few free {H100} GPUs (0 of 8 free, 4 needed))"
        )

    def test_memory_claimed_by_placed_replicas_is_accounted(self) -> None:
        m = model(profile(min_memory_mb=24000))
        scheduler = Scheduler([node("n1", memory=memory(64000))], [], [m])
        assert scheduler.place(m) is not None
        assert scheduler.place(m) is not None
        assert scheduler.place(m) is None
        assert scheduler.why_not(m) == (
            "no node can run it (node n1 has too little memory (16000 MB free of 64000 MB, 24000 MB needed))"
        )

    def test_a_failed_replica_holds_nothing(self) -> None:
        m = model(profile(gpu_class=H100))
        failed = [Replica("s1", "m", "n1", "llamacpp", "failed", profile="p", gpu_indices=[0])]
        placement = Scheduler([node("n1", gpus=gpus(1))], failed, [m]).place(m)
        assert placement is not None and placement.ranks[0].gpu_indices == (0,)


def installing(inventory: Inventory) -> None:
    inventory.attach(
        pb.Register(
            node_id="n1",
            engine_versions={"sim": "builtin"},
            engines_probed=True,
            provision=[
                pb.ProvisionStatus(
                    engine="llamacpp",
                    version="b10991",
                    state="installing",
                    detail="downloading llama-b10991-bin-ubuntu-x64.tar.gz (16 MB)",
                )
            ],
        )
    )


class TestReconciler:
    async def test_a_node_still_installing_its_engine_is_not_a_candidate(self) -> None:
        inventory = Inventory(grace_s=15)
        installing(inventory)
        cfg = ServerConfig(models=[model(profile(), name="llama")])
        await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
        assert inventory.replicas() == []
        assert inventory.why_no_ready("llama") == (
            "llama has no ready replica: no node can run it until an engine is installed "
            "(installing llamacpp b10991 on n1: downloading llama-b10991-bin-ubuntu-x64.tar.gz (16 MB))"
        )
        # Once the node reports the install done, the next pass places the replica there.
        inventory.heartbeat(
            "n1",
            pb.Heartbeat(
                engines_changed=True,
                engine_versions={"sim": "builtin", "llamacpp": "b10991"},
                provision_changed=True,
                provision=[pb.ProvisionStatus(engine="llamacpp", version="b10991", state="ready")],
            ),
        )
        await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
        assert [r.node_id for r in inventory.replicas("llama")] == ["n1"]

    async def test_a_multi_node_replica_starts_one_rank_per_node_with_its_cards(self) -> None:
        inventory = Inventory(grace_s=15)
        links = {}
        for node_id in ("n1", "n2"):
            links[node_id] = inventory.attach(
                pb.Register(
                    node_id=node_id,
                    engine_versions={"vllm": "0.11"},
                    engines_probed=True,
                    gpus=gpus(8),
                    fabrics=[pb.Fabric(name="ib0")],
                ),
                address=f"10.0.0.{node_id[1]}:5000",
            )
        m = model(profile(engine="vllm", gpu_class=H100, gpus_per_node=8, nodes=2), name="big")
        cfg = ServerConfig(models=[m], control=ControlConfig())
        await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
        starts = [links[n].outbox.get_nowait().start for n in ("n1", "n2")]
        assert [(s.rank, s.world_size, s.master_addr, s.gpu_indices) for s in starts] == [
            (0, 2, "10.0.0.1", list(range(8))),
            (1, 2, "10.0.0.1", list(range(8))),
        ]
        assert starts[0].replica_id == starts[1].replica_id
        # Two shards, one replica: the next pass asks for nothing more.
        cfg = ServerConfig(models=[m])
        await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
        assert links["n1"].outbox.empty() and links["n2"].outbox.empty()


async def test_a_snapshot_read_in_slices_places_as_one_read_at_once_and_lets_others_run():
    inventory = Inventory(15.0)
    for i in range(2500):
        inventory.attach(
            pb.Register(
                node_id=f"n{i:04d}", gpus=gpus(2), engine_versions={"llamacpp": "b1"}, engines_probed=True
            )
        )
    m = model(profile(gpu_class=H100, gpus_per_node=1), replicas=50)
    ran = 0

    async def neighbour() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(neighbour())
    await asyncio.sleep(0)
    before = ran
    sliced = await Scheduler.snapshot(inventory, ServerConfig(), [m])
    # Three slices of 1,000 nodes: the loop went round between them.
    assert ran - before >= 2
    beside.cancel()
    whole = Scheduler.for_inventory(inventory, ServerConfig(), [m])
    for _ in range(50):
        got, want = sliced.place(m), whole.place(m)
        assert got is not None and want is not None and got.ranks == want.ranks


class TestWhatToSetForAnEngine:
    """An engine no node was asked to install: the sentence says what to set, for each kind."""

    @pytest.mark.parametrize(
        ("engine", "how"),
        [
            (
                "vllm",
                'set server.yaml `engines: {vllm: "0.32.0"}` for every node to install it, '
                "or agent.yaml `engines.vllm.binary` to a build of your own",
            ),
            ("sglang", "install it on the node and set agent.yaml `engines.sglang.binary` to it"),
        ],
    )
    def test_a_fleet_without_the_engine_says_what_to_set_in_explain_and_the_summary(
        self, engine: str, how: str
    ):
        scheduler = Scheduler([node("n1", engine_versions={"sim": "1"})], [])
        wanted = model(ProfileConfig(name="p", engine=engine))
        [verdict] = scheduler.explain(wanted)
        assert verdict.reason == f"does not have {engine} installed: {how}"
        assert scheduler.why_not(wanted) == f"no node can run it (no node has the {engine} engine: {how})"

    def test_a_node_installing_the_engine_is_not_told_to_set_anything(self):
        installing = pb.ProvisionStatus(engine="vllm", version="0.32.0", state="installing")
        scheduler = Scheduler([node("n1", engine_versions={"sim": "1"}, provision=[installing])], [])
        [verdict] = scheduler.explain(model(ProfileConfig(name="p", engine="vllm")))
        assert verdict.reason == "does not have vllm installed (installing)"


class TestWarmWeights:
    """An on-demand model goes back to the node that still holds its weights, whatever the policy's order."""

    @staticmethod
    def nodes(held: Weights) -> list[Node]:
        # n1 comes first by spread's order (both empty, by id); n2 holds the weights.
        return [node("n1", memory=memory(64_000)), node("n2", memory=memory(64_000), weights=[held])]

    @staticmethod
    def on_demand(**fields: Any) -> ModelConfig:
        return ModelConfig(
            name="m", scale=ScaleConfig(min=0, max=1), profiles=[profile(engine="sim")], **fields
        )

    @pytest.mark.parametrize("policy", ["spread", "binpack"])
    def test_a_model_scaled_to_zero_starts_again_where_its_source_was_fetched(self, policy: str) -> None:
        url = "http://weights.example/m.gguf"
        held = Weights(source=url, path="/var/lib/llmgw/weights/m", size_bytes=5)
        placed = Scheduler(self.nodes(held), [], policy=policy).place(self.on_demand(source=url))
        assert placed is not None and placed.ranks[0].node == "n2"

    def test_a_file_it_pins_counts_whatever_url_served_it(self) -> None:
        # A source on the server's disk reaches the node by a URL placement does not know; its pin does.
        digest = "ab" * 32
        held = Weights(source="http://cp:7444/files/m/m.gguf", path="/w/m", size_bytes=5, sha256=digest)
        m = self.on_demand(source="/srv/models/m.gguf", sha256={"m.gguf": f"sha256:{digest.upper()}"})
        placed = Scheduler(self.nodes(held), []).place(m)
        assert placed is not None and placed.ranks[0].node == "n2"

    def test_a_node_holding_the_weights_that_cannot_take_it_is_passed_over(self) -> None:
        url = "http://weights.example/m.gguf"
        held = Weights(source=url, path="/w/m", size_bytes=5)
        nodes = [node("n1", memory=memory(64_000)), node("n2", admin_state="cordoned", weights=[held])]
        placed = Scheduler(nodes, []).place(self.on_demand(source=url))
        assert placed is not None and placed.ranks[0].node == "n1"

    def test_a_model_with_fixed_replicas_is_placed_by_the_policy_alone(self) -> None:
        url = "http://weights.example/m.gguf"
        held = Weights(source=url, path="/w/m", size_bytes=5)
        fixed = ModelConfig(name="m", replicas=1, source=url, profiles=[profile(engine="sim")])
        placed = Scheduler(self.nodes(held), []).place(fixed)
        assert placed is not None and placed.ranks[0].node == "n1"
