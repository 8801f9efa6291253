"""Session affinity and prefix-aware routing: a request goes where its prompt is cached, within a bound."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import AsyncIterator, Sequence

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from llmgw import config
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, RouterConfig, ServerConfig
from llmgw.errors import ConfigError
from llmgw.gateway.affinity import BLOCK_CHARS, PrefixIndex, prompt_blocks
from llmgw.gateway.pipeline import Call
from llmgw.gateway.router import Router
from llmgw.routes import EngineRoute

from .conftest import FakeEngine, GatewayFactory

MODEL = "sim-chat"
A, B, C, D = (f"http://127.0.0.1:{port}" for port in (1, 2, 3, 4))
SYSTEM = "You are a careful assistant who answers in full sentences. " * 20


@attrs.define
class FakeReplicas:
    ready: list[str]

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self.ready

    def why_no_ready(self, model: str) -> str:
        return "no ready replica"

    def route(self, endpoint: str) -> EngineRoute | None:
        return None


def _router(*endpoints: str, **settings: object) -> tuple[Router, FakeReplicas]:
    replicas = FakeReplicas(list(endpoints))
    catalog = Catalog(ServerConfig(models=[ModelConfig(name=MODEL)]))
    return Router(catalog, replicas, config.evolve(RouterConfig(), **settings)), replicas


def _once(router: Router, session: str = "", prompt: Sequence[int] = ()) -> str:
    """Where one request goes, finished before the next (even load)."""
    endpoint = router.route(MODEL, session, prompt)[1]
    router.release(endpoint)
    return endpoint


def _chat(*turns: str) -> list[int]:
    """The prefix hashes of a chat with the shared system prompt and these user turns."""
    messages = [{"role": "system", "content": SYSTEM}, *({"role": "user", "content": t} for t in turns)]
    return prompt_blocks(MODEL, {"messages": messages})


class TestSessionAffinity:
    def test_a_session_stays_on_one_replica_under_even_load(self) -> None:
        router, _ = _router(A, B, C, policy="affinity")
        for session in (f"user-{i}" for i in range(50)):
            assert len({_once(router, session) for _ in range(10)}) == 1

    def test_sessions_spread_over_the_replicas(self) -> None:
        router, _ = _router(A, B, C, policy="affinity")
        homes = [_once(router, f"user-{i}") for i in range(600)]
        # 64 points per replica keep the shares near a third; a fifth is far outside chance.
        assert all(homes.count(endpoint) > 120 for endpoint in (A, B, C))

    def test_a_session_over_the_load_bound_moves_and_stays_where_it_moved(self) -> None:
        router, _ = _router(A, B, policy="affinity", session_load_factor=1.25)
        home = _once(router, "alice")
        other = B if home == A else A
        # Three requests of other sessions in flight on alice's replica: mean (with hers) 2, bound 3.
        held = [router.route(MODEL)[1] for _ in range(6)]
        for endpoint in held:
            if endpoint == other:
                router.release(endpoint)
        assert router.in_flight == {home: 3}
        assert router.route(MODEL, "alice")[1] == other
        router.release(other)
        for endpoint in (home, home, home):
            router.release(endpoint)
        assert _once(router, "alice") == other

    def test_a_session_stays_while_its_replica_is_one_request_above_the_mean(self) -> None:
        """At two replicas, 1.25 × the mean alone would move it: a whole history's prefill for one wait."""
        router, _ = _router(A, B, policy="affinity", session_load_factor=1.25)
        home = _once(router, "alice")
        router.route(MODEL, "alice")
        router.route(MODEL, "alice")
        # Two in flight on alice's replica, none on the other: mean (with hers) 1.5, bound 3.
        assert router.in_flight == {home: 2}
        assert router.route(MODEL, "alice")[1] == home

    def test_a_session_within_the_load_bound_stays_though_its_replica_is_busier(self) -> None:
        router, _ = _router(A, B, policy="affinity", session_load_factor=2.0)
        home = _once(router, "alice")
        router.route(MODEL, "alice")
        # One of alice's in flight on her replica, none elsewhere: mean 1, bound 2.
        assert router.route(MODEL, "alice")[1] == home

    def test_a_session_whose_replica_drains_moves_and_only_its_sessions_move(self) -> None:
        router, replicas = _router(A, B, C, policy="affinity")
        sessions = [f"user-{i}" for i in range(300)]
        before = {s: _once(router, s) for s in sessions}
        replicas.ready = [A, C]
        after = {s: _once(router, s) for s in sessions}
        assert all(after[s] != B for s in sessions)
        assert all(after[s] == before[s] for s in sessions if before[s] != B)
        # The moved sessions stay where they moved when the replica comes back.
        replicas.ready = [A, B, C]
        assert {s: _once(router, s) for s in sessions} == after

    def test_a_replica_joining_moves_no_session(self) -> None:
        router, replicas = _router(A, B, policy="affinity")
        sessions = [f"user-{i}" for i in range(300)]
        before = {s: _once(router, s) for s in sessions}
        replicas.ready = [A, B, C]
        assert {s: _once(router, s) for s in sessions} == before
        # New sessions do find the replica that joined.
        assert C in {_once(router, f"new-{i}") for i in range(100)}

    def test_the_ring_alone_moves_only_the_sessions_a_joining_replica_takes(self) -> None:
        # Fresh routers (nothing remembered): placement is the ring's, and a join takes sessions only
        # for itself, never shuffling others between the replicas that were there.
        sessions = [f"user-{i}" for i in range(600)]
        two, _ = _router(A, B, policy="affinity")
        three, _ = _router(A, B, C, policy="affinity")
        on_two = {s: _once(two, s) for s in sessions}
        on_three = {s: _once(three, s) for s in sessions}
        moved = [s for s in sessions if on_two[s] != on_three[s]]
        assert all(on_three[s] == C for s in moved)
        assert 100 < len(moved) < 300

    def test_a_long_session_key_is_not_kept(self) -> None:
        router, _ = _router(A, B, policy="affinity")
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(20):
                key = f"{i}" + "u" * 1_000_000
                assert _once(router, key) == _once(router, key)
                del key
            assert tracemalloc.get_traced_memory()[0] - before < 1_000_000
        finally:
            tracemalloc.stop()

    def test_least_in_flight_ignores_sessions(self) -> None:
        router, _ = _router(A, B, policy="least_in_flight")
        assert {_once(router, "alice") for _ in range(4)} == {A, B}


class TestPrefixRouting:
    def test_a_prompt_goes_to_the_replica_that_served_its_prefix(self) -> None:
        router, _ = _router(A, B, C, D, policy="prefix")
        first = {f"conv-{i}": _once(router, prompt=_chat(f"conversation {i} " * 30)) for i in range(8)}
        for i in range(8):
            grown = _chat(f"conversation {i} " * 30, "and a second turn " * 10)
            assert _once(router, prompt=grown) == first[f"conv-{i}"]

    def test_the_longest_matching_prefix_wins_over_a_shared_system_prompt(self) -> None:
        router, _ = _router(A, B, policy="prefix")
        one = _once(router, prompt=_chat("first conversation " * 30))
        two = B if one == A else A
        router.prefixes.record(_chat("second conversation " * 30), two)
        # The system prompt's blocks have been served by both; each conversation's longer prefix
        # still names its own replica.
        for _ in range(3):
            assert _once(router, prompt=_chat("first conversation " * 30, "more")) == one
            assert _once(router, prompt=_chat("second conversation " * 30, "more")) == two

    def test_new_conversations_under_a_system_prompt_every_replica_served_spread_by_load(self) -> None:
        """Not all to whichever replica served the shared system prompt last: both cache it."""
        router, _ = _router(A, B, policy="prefix")
        router.prefixes.record(_chat("first conversation " * 30), A)
        router.prefixes.record(_chat("second conversation " * 30), B)
        homes = [_once(router, prompt=_chat(f"conversation {i} " * 30)) for i in range(10)]
        assert homes.count(A) == homes.count(B) == 5

    def test_a_system_prompt_only_one_replica_served_draws_new_conversations_while_it_is_least_loaded(
        self,
    ) -> None:
        router, _ = _router(A, B, C, policy="prefix")
        home = _once(router, prompt=_chat("first conversation " * 30))
        assert {_once(router, prompt=_chat(f"conversation {i} " * 30)) for i in range(5)} == {home}
        # One in flight there, none elsewhere: within the load bound, but not among the least
        # loaded, so the next new conversation goes elsewhere rather than piling up behind it.
        assert router.route(MODEL, "", _chat("busy conversation " * 30))[1] == home
        assert router.route(MODEL, "", _chat("new conversation " * 30))[1] != home

    def test_a_one_message_prompt_goes_back_where_it_was_served_within_the_bound(self) -> None:
        router, _ = _router(A, B, policy="prefix")
        prompt = prompt_blocks(MODEL, {"messages": [{"role": "user", "content": SYSTEM}]})
        home = _once(router, prompt=prompt)
        assert router.route(MODEL, "", prompt)[1] == home
        assert router.route(MODEL, "", prompt)[1] == home

    def test_a_prefix_replica_over_the_load_bound_gives_way_to_the_least_loaded(self) -> None:
        router, _ = _router(A, B, policy="prefix", session_load_factor=1.0)
        prompt = _chat("a long conversation " * 30)
        home = _once(router, prompt=prompt)
        for _ in range(2):
            assert router.route(MODEL, "", prompt)[1] == home
        # Two in flight on home: mean (with this one) 1.5, bound 3; three: mean 2, bound 3.
        assert router.route(MODEL, "", prompt)[1] == home
        assert router.route(MODEL, "", prompt)[1] != home

    def test_a_request_with_a_session_key_is_placed_by_its_session(self) -> None:
        router, _ = _router(A, B, C, policy="prefix")
        prompt = _chat("shared " * 100)
        served = _once(router, prompt=prompt)
        homes = {_once(router, f"user-{i}", prompt) for i in range(60)}
        assert homes != {served}

    def test_a_completion_prompt_shorter_than_a_block_routes_by_load(self) -> None:
        router, _ = _router(A, B, policy="prefix")
        blocks = prompt_blocks(MODEL, {"prompt": "hi"})
        assert {_once(router, prompt=blocks) for _ in range(4)} == {A, B}
        assert len(router.prefixes) == 0

    def test_a_completion_prompt_goes_where_its_start_was_served(self) -> None:
        router, _ = _router(A, B, C, policy="prefix")
        story = "Once upon a time " * 200
        home = _once(router, prompt=prompt_blocks(MODEL, {"prompt": story}))
        for ending in ("and they lived happily", "and then the dragon came back"):
            assert _once(router, prompt=prompt_blocks(MODEL, {"prompt": [story, ending * 60]})) == home


class TestNeverToAReplicaThatIsNotReady:
    @pytest.mark.parametrize("policy", ["least_in_flight", "affinity", "prefix"])
    def test_a_replica_that_left_the_ready_table_is_never_chosen(self, policy: str) -> None:
        """Drained, failed, unreachable: all leave the ready table, and no memory brings a request back."""
        everyone = [A, B, C, D]
        router, replicas = _router(*everyone, policy=policy, session_load_factor=1.0)
        rng = random.Random(20)
        held: list[str] = []
        for step in range(3000):
            if step % 50 == 0:
                replicas.ready = rng.sample(everyone, rng.randint(1, 4))
            session = f"user-{rng.randrange(40)}" if rng.random() < 0.5 else ""
            prompt = _chat(f"conversation {rng.randrange(40)} " * 30, "turn " * rng.randrange(3))
            endpoint = router.route(MODEL, session, prompt)[1]
            assert endpoint in replicas.ready
            held.append(endpoint)
            if rng.random() < 0.6:
                router.release(held.pop(rng.randrange(len(held))))


class TestSessionKey:
    def _key(self, headers: dict[str, str], payload: dict[str, object], **settings: object) -> str:
        router, _ = _router(A, **{"policy": "affinity", **settings})
        request = make_mocked_request("POST", "/v1/chat/completions", headers=headers)
        return router.session_of(Call(request, payload=payload))

    def test_the_llmgw_header_comes_before_x_session_id_and_user(self) -> None:
        headers = {"X-Session-Id": "s", "X-LLMGW-Session": "g"}
        assert self._key(headers, {"user": "u"}) == "g"
        assert self._key({"x-session-id": "s"}, {"user": "u"}) == "s"
        assert self._key({}, {"user": "u"}) == "u"

    def test_a_request_without_a_key_has_none(self) -> None:
        assert self._key({}, {"user": 42}) == ""
        assert self._key({"x-session-id": ""}, {}) == ""

    def test_the_headers_and_the_user_field_are_configurable(self) -> None:
        assert self._key({"x-session-id": "s"}, {"user": "u"}, session_headers=["x-conversation"]) == "u"
        assert self._key({"X-Conversation": "c"}, {}, session_headers=["x-conversation"]) == "c"
        assert self._key({}, {"user": "u"}, session_from_user=False) == ""

    def test_least_in_flight_reads_no_key(self) -> None:
        assert self._key({"x-session-id": "s"}, {"user": "u"}, policy="least_in_flight") == ""


class TestPrefixIndex:
    def test_the_index_never_holds_more_prefixes_than_its_capacity(self) -> None:
        index = PrefixIndex(capacity=100)
        for i in range(200):
            index.record(prompt_blocks(MODEL, {"prompt": f"{i} " * 2000}), A)
            assert len(index) <= 100
        assert len(index) > 50

    def test_the_most_recently_served_prompts_are_remembered(self) -> None:
        index = PrefixIndex(capacity=40)
        prompts = [
            prompt_blocks(MODEL, {"messages": [{"role": "user", "content": f"conversation {i}"}] * 2})
            for i in range(30)
        ]
        for blocks in prompts:
            index.record(blocks, A)
        assert index.choose(prompts[-1], [A, B], {}, 1.25) == A
        assert all(index.choose(blocks, [A, B], {}, 1.25) is None for blocks in prompts[:10])

    def test_a_prefix_two_replicas_served_names_neither(self) -> None:
        index = PrefixIndex(capacity=100)
        shared = _chat()
        index.record(_chat("first conversation"), A)
        assert index.choose(shared, [A, B], {}, 1.25) == A
        index.record(_chat("second conversation"), B)
        assert index.choose(shared, [A, B], {}, 1.25) is None
        assert index.choose(_chat("first conversation"), [A, B], {}, 1.25) == A
        assert index.choose(_chat("second conversation"), [A, B], {}, 1.25) == B
        index.record(shared, A)  # served by A once more: still held by both
        assert index.choose(shared, [A, B], {}, 1.25) is None

    def test_a_chat_has_one_prefix_per_message_each_covering_those_before(self) -> None:
        system = {"role": "system", "content": "be brief"}
        one = prompt_blocks(MODEL, {"messages": [system, {"role": "user", "content": "a"}]})
        two = prompt_blocks(MODEL, {"messages": [system, {"role": "user", "content": "b"}]})
        assert len(one) == 2 and one[0] == two[0] and one[1] != two[1]
        assert prompt_blocks("other-model", {"messages": [system]})[0] != one[0]
        # The same text from another role is another prompt.
        assert prompt_blocks(MODEL, {"messages": [{"role": "user", "content": "be brief"}]})[0] != one[0]

    def test_text_parts_count_and_what_is_not_a_prompt_counts_as_nothing(self) -> None:
        parts = {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]}
        assert len(prompt_blocks(MODEL, {"messages": [parts, "not a message"]})) == 1
        assert prompt_blocks(MODEL, {"messages": [{"role": "user", "content": {"a": 1}}]}) == []
        assert prompt_blocks(MODEL, {"prompt": [1, 2]}) == []
        assert prompt_blocks(MODEL, {}) == []

    def test_a_prompt_past_64k_characters_is_hashed_only_that_far(self) -> None:
        huge = [{"role": "user", "content": "x" * 40_000} for _ in range(5)]
        assert len(prompt_blocks(MODEL, {"messages": huge})) == 1
        assert len(prompt_blocks(MODEL, {"prompt": "y" * 10**6})) == 65536 // BLOCK_CHARS


class TestConfig:
    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("router:\n  session_load_factor: 0.5\n", "expected 1 or more and at most 1,000"),
            ("router:\n  policy: random\n", "expected one of least_in_flight, affinity, prefix"),
            ("router:\n  prefix_index_entries: 0\n", "expected 1 or more and at most 100,000,000"),
        ],
    )
    def test_a_bad_router_setting_is_refused_saying_why(self, text: str, says: str) -> None:
        with pytest.raises(ConfigError, match=says):
            config.parse(ServerConfig, text, "server.yaml")


@pytest.fixture
async def two_engines() -> AsyncIterator[list[tuple[FakeEngine, str]]]:
    engines: list[tuple[FakeEngine, str]] = []
    servers: list[TestServer] = []
    for _ in range(2):
        fake = FakeEngine()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", fake.chat)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        engines.append((fake, f"http://127.0.0.1:{server.port}"))
    yield engines
    for server in reversed(servers):
        await server.close()


class TestThroughTheGateway:
    async def test_a_conversations_turns_reach_one_engine_by_header_user_or_prompt(
        self, make_gateway: GatewayFactory, two_engines: list[tuple[FakeEngine, str]]
    ) -> None:
        gateway = await make_gateway()
        gateway.replicas.endpoints[MODEL] = [url for _, url in two_engines]
        conversations: list[tuple[dict[str, str], dict[str, object]]] = [
            ({"x-session-id": "alice"}, {}),
            ({"x-llmgw-session": "bob"}, {}),
            ({}, {"user": "carol"}),
            ({}, {}),  # no key: its prompt places it
        ]
        for i, (headers, extra) in enumerate(conversations):
            turns: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
            before = [len(fake.received) for fake, _ in two_engines]
            for turn in range(4):
                turns.append({"role": "user", "content": f"conversation {i}, turn {turn} " * 20})
                body = {"model": MODEL, "messages": turns, **extra}
                reply = await gateway.client.post(
                    "/v1/chat/completions", json=body, headers={**gateway.auth, **headers}
                )
                assert reply.status == 200
            got = [len(fake.received) - n for (fake, _), n in zip(two_engines, before, strict=True)]
            assert sorted(got) == [0, 4]
