"""What a supervisor reported, for tests that wait for a shard to reach a state."""

from __future__ import annotations

import asyncio

from llmgw.proto.llmgw import v1 as pb

WAIT_S = 60.0


class Reports:
    """Every status reported, and a way to wait for one."""

    def __init__(self) -> None:
        self.statuses: list[pb.ShardStatus] = []
        self._changed = asyncio.Event()

    def __call__(self, status: pb.ShardStatus) -> None:
        self.statuses.append(status)
        self._changed.set()

    async def wait_for(self, state: str, shard_id: str = "s1") -> pb.ShardStatus:
        async with asyncio.timeout(WAIT_S):
            while True:
                for status in self.statuses:
                    if status.shard_id == shard_id and status.state == state:
                        return status
                self._changed.clear()
                await self._changed.wait()
