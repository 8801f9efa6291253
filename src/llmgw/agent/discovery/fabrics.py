"""The InfiniBand fabric a node is on: the name agent.yaml gives it, with the HCAs that are up.

The name comes from the operator because nothing on the machine says which
switches its HCAs are cabled to; two nodes can host one multi-node replica
together only when they were given the same name. The HCAs come from
/sys/class/infiniband, and only those with a port up count: a node whose
cable is out must not be handed half of a tensor-parallel group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import attrs

from llmgw.proto.llmgw import v1 as pb

INFINIBAND = Path("/sys/class/infiniband")


@attrs.frozen
class FabricReport:
    fabrics: list[pb.Fabric]
    # Why a configured fabric is missing or incomplete, in an operator's words.
    warnings: list[str]


def active_hcas(root: Path = INFINIBAND) -> list[str]:
    """HCAs with at least one port whose state is ACTIVE; blocking."""
    try:
        hcas = sorted(p.name for p in root.iterdir())
    except OSError:
        return []
    up = []
    for hca in hcas:
        for state in sorted((root / hca / "ports").glob("*/state")):
            try:
                # "4: ACTIVE"
                if "ACTIVE" in state.read_text(encoding="ascii", errors="replace"):
                    up.append(hca)
                    break
            except OSError:
                continue
    return up


def read_fabrics(name: str, hcas: Sequence[str], root: Path = INFINIBAND) -> FabricReport:
    """The configured fabric, if any of its HCAs is up; blocking."""
    if not name:
        return FabricReport([], [])
    up = active_hcas(root)
    wanted = list(hcas) or up
    present = [h for h in wanted if h in up]
    missing = [h for h in wanted if h not in up]
    warnings = []
    if not present:
        named = f" ({', '.join(wanted)})" if wanted else ""
        warnings.append(
            f"fabric {name} is configured but none of its HCAs{named} has a port up under {root}; "
            "this node takes no multi-node replica"
        )
        return FabricReport([], warnings)
    if missing:
        warnings.append(f"fabric {name}: {', '.join(missing)} has no port up under {root}")
    return FabricReport([pb.Fabric(name=name, hcas=present)], warnings)


async def discover_fabrics(name: str, hcas: Sequence[str], root: Path = INFINIBAND) -> FabricReport:
    return await asyncio.to_thread(read_fabrics, name, list(hcas), root)
