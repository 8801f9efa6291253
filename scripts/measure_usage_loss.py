"""Requests served vs usage recorded, per key, over PostgreSQL outages and SIGKILLs of two servers.

Run from the repository root: `python scripts/measure_usage_loss.py --rounds 10`. Each round sends
requests through both gateways (one key each), stops PostgreSQL (`-m immediate`) while more are sent,
starts it, then SIGKILLs one server right after its requests and starts it again; it prints what the
clients received and what the store recorded, per key, once the writers have caught up (or 90 s).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.gateways import server_process
from tests.e2e.test_usage_across_gateways import _keys, _kill, _recorded, _send
from tests.postgres import Cluster, running_cluster


async def _settled(cluster: Cluster, url: str, served: Counter[int]) -> Counter[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:
        found = await asyncio.to_thread(_recorded, cluster, url)
        if found == served or loop.time() > deadline:
            return found
        await asyncio.sleep(0.5)


async def _measure(rounds: int) -> int:
    unequal = 0
    with running_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        url = cluster.fresh_database()
        (a_id, a_key), (b_id, b_key) = await _keys(url, 2)
        served: Counter[int] = Counter()
        base = Path(tmp)
        for n in range(1, rounds + 1):
            async with server_process(base / "a", url) as a, server_process(base / "b", url) as b:
                served[a_id] += await _send(a, a_key, 20)
                served[b_id] += await _send(b, b_key, 5)
                await asyncio.to_thread(cluster.stop, "immediate")
                try:
                    served[a_id] += await _send(a, a_key, 10)
                    served[b_id] += await _send(b, b_key, 10)
                    await asyncio.sleep(2)  # a writer's try or two against the stopped store
                finally:
                    await asyncio.to_thread(cluster.start)
                outage = await _settled(cluster, url, served)
                print(f"round {n} outage:  served {dict(served)}  recorded {dict(outage)}", flush=True)
                unequal += outage != served
                served[b_id] += await _send(b, b_key, 20)
                await _kill(b)
            async with server_process(base / "b", url):
                killed = await _settled(cluster, url, served)
            print(f"round {n} SIGKILL: served {dict(served)}  recorded {dict(killed)}", flush=True)
            unequal += killed != served
    print(f"{2 * rounds} checks, {unequal} unequal")
    return 1 if unequal else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    sys.exit(asyncio.run(_measure(parser.parse_args().rounds)))


if __name__ == "__main__":
    main()
