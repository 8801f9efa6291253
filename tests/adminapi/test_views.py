"""The admin API's views: the states they list, and the way back from JSON that ctl takes."""

from __future__ import annotations

from typing import get_args

from llmgw.adminapi import projections, views
from llmgw.agent.provision import installer
from llmgw.control.inventory import ADMIN_STATES, Inventory
from llmgw.proto.llmgw import v1 as pb


def test_the_states_the_views_list_are_the_ones_the_inventory_and_the_installer_use():
    assert get_args(views.AdminState) == ADMIN_STATES
    assert set(get_args(views.NodeState)) == {*ADMIN_STATES, "disconnected", "unreachable"}
    assert set(get_args(views.InstallState)) == {
        installer.INSTALLING,
        installer.READY,
        installer.FAILED,
        installer.UNSUPPORTED,
    }


def test_a_node_read_back_from_its_json_is_the_node_that_was_sent():
    inventory = Inventory(5.0, clock=lambda: 100.0)
    inventory.attach(
        pb.Register(
            node_id="n1",
            engines_probed=True,
            gpus=[pb.Gpu(index=0, name="L4", gpu_class="l4-24g", healthy=True)],
            memory=pb.Memory(total_mb=4096, available_mb=1024),
            provision=[
                pb.ProvisionStatus(engine="llamacpp", version="b6500", state="failed", detail="no libgomp")
            ],
        )
    )
    inventory.attach(pb.Register(node_id="n2"))
    sent = projections.nodes_view(inventory)
    json = views.CONVERTER.unstructure(sent)
    assert json[1]["gpus"] is None and json[0]["provision"][0]["state"] == "failed"
    assert views.CONVERTER.structure(json, list[views.Node]) == sent
