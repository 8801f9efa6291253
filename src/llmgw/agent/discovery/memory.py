"""The node's memory, as placement counts it: total, and what is available to a new engine."""

from __future__ import annotations

import asyncio

import psutil

from llmgw.proto.llmgw import v1 as pb


def read_memory() -> pb.Memory:
    """Blocking (psutil reads /proc): call through `discover_memory`."""
    vm = psutil.virtual_memory()
    return pb.Memory(total_mb=vm.total // 2**20, available_mb=vm.available // 2**20)


async def discover_memory() -> pb.Memory:
    return await asyncio.to_thread(read_memory)
