"""`llmgw usage`: the store's usage added up by org, team, project, key or model, in three formats."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw.cli.main import main
from llmgw.config import PriceConfig
from llmgw.gateway.admission import TEMPLATE_OVERHEAD
from llmgw.gateway.app import MAX_BODY as MAX_GATEWAY_BODY
from llmgw.maxima import MAX_PRICE_PER_1K, MAX_TOKENS
from llmgw.pricing import cost
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key, revoke_key
from llmgw.store.usage import USAGE_BY, UsageKey, UsageTotals, add_usage
from llmgw.tenancy import operations as tenancy

DAYS = ("2026-11-01", "2026-11-15", "2026-11-30")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


def _usage(config: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["usage", *args, "--config", str(config)], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def _populate(store: Store) -> None:
    """Usage on three days by keys of three projects in two orgs, one of them deleted since, and none."""
    await tenancy.create(store, "org", "acme")
    await tenancy.create(store, "team", "core", "acme")
    await tenancy.create(store, "project", '=HYPERLINK("http://x")', "core")
    gone = await tenancy.create(store, "project", "gone", "core")
    _, key1 = await create_key(store, "default-key")
    _, key2 = await create_key(store, "acme-key", project_id=2)
    _, key3 = await create_key(store, "gone-key", project_id=gone.id)
    batch: list[tuple[UsageKey, UsageTotals]] = []
    for d, day in enumerate(DAYS):
        for key, project in ((key1, 1), (key2, 2), (key3, gone.id), (None, 1)):
            for m, model in enumerate(("sim-chat", "llama")):
                for status in (200, 429):
                    n = 1 + d + m + (key.id if key else 0)
                    batch.append(
                        (
                            UsageKey(day, key.id if key else 0, project, model, status),
                            UsageTotals(n, 100 * n + 7, 31 * n + 3, 0.001 * n, 10.0 * n),
                        )
                    )
    await add_usage(store, batch)
    await revoke_key(store, key3.prefix)
    await tenancy.delete(store, "project", "gone")


async def _store_sums(store: Store, since: str = "0000", until: str = "9999") -> dict[str, Any]:
    async with store.db.execute(
        "SELECT SUM(requests) AS requests, SUM(prompt_tokens) AS prompt,"
        " SUM(completion_tokens) AS completion, SUM(cost) AS cost"
        " FROM usage_daily WHERE day >= ? AND day <= ?",
        (since, until),
    ) as cursor:
        row = await cursor.fetchone()
    assert row is not None
    return dict(row)


@pytest.fixture
def populated(config: Path) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with open_store(config.parent / "state" / "llmgw.db") as store:
            await _populate(store)
            return {
                "all": await _store_sums(store),
                "mid": await _store_sums(store, "2026-11-15", "2026-11-15"),
            }

    return asyncio.run(run())


@pytest.mark.parametrize("by", USAGE_BY)
def test_the_totals_by_every_grouping_equal_the_stores_to_the_token(
    config: Path, populated: dict[str, Any], by: str
) -> None:
    code, out, _ = _usage(config, "--by", by, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert {r["by"] for r in rows} == {by}
    store = populated["all"]
    assert sum(r["requests"] for r in rows) == store["requests"]
    assert sum(r["prompt_tokens"] for r in rows) == store["prompt"]
    assert sum(r["completion_tokens"] for r in rows) == store["completion"]
    assert sum(r["cost"] for r in rows) == pytest.approx(store["cost"])


def test_since_and_until_count_only_the_days_between_them_inclusive(
    config: Path, populated: dict[str, Any]
) -> None:
    code, out, _ = _usage(
        config, "--by", "model", "--since", "2026-11-15", "--until", "2026-11-15", "--format", "json"
    )
    assert code == 0
    rows = json.loads(out)
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == (
        populated["mid"]["prompt"] + populated["mid"]["completion"]
    )
    assert [r["name"] for r in rows] == ["llama", "sim-chat"]


@pytest.mark.parametrize("by", ["team", "org"])
def test_usage_of_a_project_deleted_since_still_counts_toward_its_team_and_org(
    config: Path, populated: dict[str, Any], by: str
) -> None:
    """Deleting `gone` must not take what it spent off its team's and org's totals (their budgets'
    too: tests/gateway/test_quotas.py)."""
    _, out, _ = _usage(config, "--by", by, "--format", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    core = rows["team 'core' (org 'acme')" if by == "team" else "org 'acme'"]
    # Keys 2 (project 2) and 3 (`gone`, project 3): 1 + d + m + key requests each, for 3 days, 2 models
    # and 2 statuses.
    assert core["requests"] == sum(
        2 * (1 + d + m + key) for d in range(3) for m in range(2) for key in (2, 3)
    )
    assert not any(r["id"] == "" for r in rows.values())


def test_usage_of_a_project_deleted_by_an_earlier_release_is_its_own_row_rather_than_lost(
    config: Path, populated: dict[str, Any]
) -> None:
    """An earlier release recorded no team for the project it deleted: its usage is counted all the same."""

    async def forget() -> None:
        async with open_store(config.parent / "state" / "llmgw.db") as store, store.transaction() as db:
            await db.execute("DELETE FROM deleted_projects")

    asyncio.run(forget())
    _, out, _ = _usage(config, "--by", "team", "--format", "json")
    names = [r["name"] for r in json.loads(out)]
    assert "projects deleted by an earlier release" in names and "team 'core' (org 'acme')" in names


def test_a_project_made_after_one_was_deleted_shows_none_of_the_deleted_ones_usage(
    config: Path, populated: dict[str, Any]
) -> None:
    """The deleted project `gone` was the highest; the next one made takes an id of its own."""
    _, before, _ = _usage(config, "--by", "project", "--format", "json")

    async def make() -> int:
        async with open_store(config.parent / "state" / "llmgw.db") as store:
            return (await tenancy.create(store, "project", "attacker", "core")).id

    attacker = asyncio.run(make())
    _, after, _ = _usage(config, "--by", "project", "--format", "json")
    assert json.loads(after) == json.loads(before)
    assert str(attacker) not in [r["id"] for r in json.loads(after)]
    assert "project 3" in [r["name"] for r in json.loads(after)]


def test_the_table_ends_with_the_total_and_names_each_group(config: Path, populated: dict[str, Any]) -> None:
    code, out, _ = _usage(config, "--by", "key")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["KEY", "REQUESTS", "ERRORS"]
    assert any("no key (auth disabled)" in line for line in lines)
    assert any("key 'acme-key'" in line for line in lines)
    total = lines[-1].split()
    assert total[0] == "TOTAL" and int(total[1]) == populated["all"]["requests"]


def test_csv_has_a_header_and_keeps_a_name_that_looks_like_a_formula_as_text(
    config: Path, populated: dict[str, Any]
) -> None:
    code, out, _ = _usage(config, "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(tenancy.USAGE_COLUMNS)
    names = [r["name"] for r in rows]
    assert any(n.startswith("project '=HYPERLINK") for n in names)
    assert sum(int(r["requests"]) for r in rows) == populated["all"]["requests"]
    for row in rows:
        assert not row["name"].startswith(("=", "+", "-", "@"))


def test_a_range_that_ends_before_it_starts_is_refused(config: Path) -> None:
    code, _, err = _usage(config, "--since", "2026-12-01", "--until", "2026-11-01")
    assert code == 1 and "--since 2026-12-01 is after --until 2026-11-01" in err


def test_a_day_not_written_as_yyyy_mm_dd_is_refused(config: Path) -> None:
    code, _, err = _usage(config, "--since", "1/12/2026")
    assert code == 2 and "--since" in err


def test_with_no_usage_it_says_so(config: Path) -> None:
    code, out, err = _usage(config)
    assert code == 0 and out == "" and "no usage in these days" in err


def test_a_formula_name_is_written_with_a_quote_in_front() -> None:
    row = tenancy.tv.UsageRow("model", "=1+1", "=1+1", 1, 0, 1, 1, 2, 0.0)
    assert tenancy.usage_csv([row]).splitlines()[1].startswith("model,'=1+1,'=1+1,")


def _not_json(constant: str) -> float:
    raise AssertionError(f"the output holds {constant}, which is not JSON")


def test_json_holds_finite_costs_at_the_dearest_prices_and_for_a_cost_once_stored_as_inf(
    config: Path,
) -> None:
    """A price of 1e308 once made a cost inf, and `--format json` printed Infinity."""
    dearest = PriceConfig(prompt_per_1k=MAX_PRICE_PER_1K, completion_per_1k=MAX_PRICE_PER_1K)
    prompt, completion = MAX_GATEWAY_BODY + TEMPLATE_OVERHEAD, MAX_TOKENS
    at_the_bound = UsageTotals(1, prompt, completion, cost(dearest, prompt, completion), 1.0)
    # What an earlier release recorded for one long prompt at 1e308 per 1,000 tokens.
    once_inf = UsageTotals(1, 400_000, 0, math.inf, 1.0)

    async def fill() -> None:
        async with open_store(config.parent / "state" / "llmgw.db") as store:
            await add_usage(
                store,
                [
                    (UsageKey("2026-11-01", 0, 1, "dear", 200), at_the_bound),
                    (UsageKey("2026-11-02", 0, 1, "dear", 200), at_the_bound),
                    (UsageKey("2026-11-01", 0, 1, "old", 200), once_inf),
                ],
            )

    asyncio.run(fill())
    code, out, _ = _usage(config, "--by", "model", "--format", "json")
    assert code == 0
    costs = {row["id"]: row["cost"] for row in json.loads(out, parse_constant=_not_json)}
    assert costs["dear"] == pytest.approx(2 * at_the_bound.cost) and math.isfinite(costs["dear"])
    assert costs["old"] == sys.float_info.max
    code, out, _ = _usage(config, "--by", "project")
    assert code == 0 and "inf" not in out
