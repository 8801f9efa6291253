"""What admitting a request costs in CPU: the one-gateway path against a lease in hand on PostgreSQL.

    python scripts/bench_admission.py [--postgres postgresql://USER@HOST:PORT/DB] [--requests N]

Admits and settles N requests on a key whose project has an rpm, a tpm and a
budget (none of which binds), first with the in-memory windows alone (SQLite,
one gateway), then, given --postgres, with leases claimed from that database
(several gateways). Prints microseconds of CPU per request, the median of five
runs; the leases are claimed before the clock starts, as they are on a busy
gateway, whose renewals run between requests and are counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

from llmgw.gateway.allowance import Allowance
from llmgw.gateway.quotas import Quotas, Short
from llmgw.gateway.usage import UsageRecorder
from llmgw.store.keys import KeyRecord
from llmgw.store.postgres import open_postgres
from llmgw.store.quotas import Budget, Limits
from llmgw.store.scopes import Hierarchy, Org, Project, Scope, Team

KEY = KeyRecord(
    id=1,
    name="bench",
    prefix="sk-llmgw-bench",
    key_hash="h",
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    revoked_at=None,
    project_id=1,
)
HIERARCHY = Hierarchy({1: Org(1, "o")}, {1: Team(1, 1, "t")}, {1: Project(1, 1, "p")})
LIMITS = [Limits(Scope("project", 1), rpm=10**9, tpm=10**12)]
BUDGETS = [Budget(Scope("project", 1), amount=1e12, period="month")]


def _quotas(allowance: Allowance | None) -> Quotas:
    quotas = Quotas(UsageRecorder(), allowance=allowance)
    quotas.replace(HIERARCHY, LIMITS, BUDGETS)
    return quotas


async def _admit(quotas: Quotas) -> None:
    try:
        ticket = quotas.admit(KEY, 200, 0.001)
    except Short as short:
        ticket = await quotas.admit_leased(KEY, 200, 0.001, short)
    quotas.settle(ticket, 150, 0.0008)


async def _run(quotas: Quotas, requests: int) -> float:
    """CPU microseconds per request of one run."""
    await _admit(quotas)  # the first claims the leases
    started = time.process_time()
    for _ in range(requests):
        await _admit(quotas)
    return (time.process_time() - started) / requests * 1e6


async def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--postgres", help="a PostgreSQL database to claim leases from")
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    memory = [await _run(_quotas(None), args.requests) for _ in range(5)]
    print(f"in memory (SQLite, one gateway): {statistics.median(memory):.2f} µs of CPU per request")
    if args.postgres:
        async with open_postgres(args.postgres) as store:
            leased = []
            for _ in range(5):
                allowance = Allowance(store.pool)
                leased.append(await _run(_quotas(allowance), args.requests))
                await allowance.give_back()
        print(f"with leases (PostgreSQL):        {statistics.median(leased):.2f} µs of CPU per request")


if __name__ == "__main__":
    asyncio.run(main())
