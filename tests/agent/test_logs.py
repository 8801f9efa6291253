"""The agent's answer to a LogsRequest."""

from __future__ import annotations

from llmgw.agent.logs import answer
from llmgw.log import LogRing
from llmgw.proto.llmgw import v1 as pb


class Engines:
    def __init__(self, outputs: dict[str, list[str]]) -> None:
        self._outputs = outputs

    def output(self, shard_id: str) -> list[str]:
        return list(self._outputs.get(shard_id, []))

    def sources(self) -> list[str]:
        return list(self._outputs)


def ring(*lines: str) -> LogRing:
    r = LogRing(capacity=10)
    for line in lines:
        r.append(line)
    return r


class TestAnswer:
    def test_the_agents_own_lines_are_the_newest_asked_for_and_every_source_is_listed(self):
        reply = answer(
            pb.LogsRequest(request_id="r1", source="agent", lines=2),
            ring("a", "b", "c"),
            Engines({"s2": ["x"], "s1": ["y"]}),
        )
        assert reply.request_id == "r1"
        assert reply.lines == ["b", "c"]
        assert reply.sources == ["agent", "s1", "s2"]
        assert reply.error == ""

    def test_a_request_naming_no_source_reads_the_agents_log(self):
        reply = answer(pb.LogsRequest(request_id="r1"), ring("a"), Engines({}))
        assert (reply.lines, reply.sources) == (["a"], ["agent"])

    def test_an_engines_output_is_read_by_its_shard_id(self):
        reply = answer(
            pb.LogsRequest(request_id="r2", source="s1", lines=2),
            ring("agent line"),
            Engines({"s1": ["one", "two", "three"]}),
        )
        assert reply.lines == ["two", "three"]

    def test_an_unknown_source_is_refused_in_words_with_the_sources_there_are(self):
        reply = answer(pb.LogsRequest(request_id="r3", source="gone-1"), ring(), Engines({"s1": []}))
        assert reply.error == "no engine gone-1 runs on this node"
        assert reply.lines == []
        assert reply.sources == ["agent", "s1"]
