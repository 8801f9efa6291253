"""An engine archive's download says how far it is, and says so when nothing arrives."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from llmgw.agent.provision.installer import INSTALLING, READY, Installer, Want
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.transfer import amount_of

from ...waiting import eventually

MB = 1 << 20


def test_an_amount_is_said_in_the_unit_of_the_whole() -> None:
    assert amount_of(12 * MB, 16 * MB) == "12 of 16 MB"
    assert amount_of(100 << 10, 391 << 10) == "100 of 391 KB"
    assert amount_of(3 << 29, 3 << 30) == "1.5 of 3.0 GB"
    assert amount_of(12 * MB, None) == "12 MB"


async def test_a_slow_download_says_how_far_it_is_and_that_nothing_arrives(
    tmp_path: Path, machine: Any, releases: ReleaseClient, release: Any, recorder: Any, kit: Any
) -> None:
    asset = kit.CPU_ASSET
    archive = kit.tar_gz(
        {
            "llama-b1/llama-server": "#!/bin/sh\necho version: 1\n",
            "llama-b1/libllama.so.0": "x",
            # Random, so gzip leaves it its size: a little over 3 MB in all.
            "llama-b1/weights.bin": os.urandom(3 * MB),
        }
    )
    release.assets[asset] = archive
    release.digests[asset] = f"sha256:{kit.sha256(archive)}"
    release.pause_after, release.pause = 2 * MB, asyncio.Event()
    installer = Installer(
        tmp_path / "engines", kit.UBUNTU, machine, releases, on_status=recorder, download_stall_s=0.05
    )

    def details() -> list[str]:
        return [s.detail for s in recorder.seen if s.state == INSTALLING]

    async with asyncio.TaskGroup() as tg:
        installing = tg.create_task(installer.converge([Want("llamacpp", "b1")]))
        await eventually(lambda: f"downloading {asset} (2 of 3 MB)" in details())
        await eventually(lambda: f"downloading {asset} (2 of 3 MB; nothing received for 0.1 s)" in details())
        release.pause.set()

    (st,) = installing.result()
    assert st.state == READY, st.detail
    said = details()
    assert f"downloading {asset} (3 of 3 MB)" in said, said
    assert len([d for d in said if d.startswith("downloading")]) < 30, "the download was said chunk by chunk"
