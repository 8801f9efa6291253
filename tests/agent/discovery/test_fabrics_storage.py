"""Fabrics from a /sys/class/infiniband a test writes, and the filesystems weights are kept on."""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.agent.discovery.fabrics import active_hcas, read_fabrics
from llmgw.agent.discovery.storage import read_storage


def _hca(root: Path, name: str, *states: str) -> None:
    for port, state in enumerate(states, 1):
        (root / name / "ports" / str(port)).mkdir(parents=True)
        (root / name / "ports" / str(port) / "state").write_text(state + "\n")


class TestFabrics:
    def test_only_hcas_with_a_port_up_count(self, tmp_path: Path) -> None:
        _hca(tmp_path, "mlx5_0", "4: ACTIVE")
        _hca(tmp_path, "mlx5_1", "1: DOWN", "4: ACTIVE")
        _hca(tmp_path, "mlx5_2", "1: DOWN")
        assert active_hcas(tmp_path) == ["mlx5_0", "mlx5_1"]

    def test_a_named_fabric_is_reported_with_its_hcas_that_are_up(self, tmp_path: Path) -> None:
        _hca(tmp_path, "mlx5_0", "4: ACTIVE")
        _hca(tmp_path, "mlx5_1", "1: DOWN")
        report = read_fabrics("ib-east", ["mlx5_0", "mlx5_1"], tmp_path)
        assert [(f.name, f.hcas) for f in report.fabrics] == [("ib-east", ["mlx5_0"])]
        assert report.warnings == [f"fabric ib-east: mlx5_1 has no port up under {tmp_path}"]

    def test_without_hcas_named_every_hca_that_is_up_is_the_fabrics(self, tmp_path: Path) -> None:
        _hca(tmp_path, "mlx5_0", "4: ACTIVE")
        _hca(tmp_path, "mlx5_1", "4: ACTIVE")
        (fabric,) = read_fabrics("ib-east", [], tmp_path).fabrics
        assert fabric.hcas == ["mlx5_0", "mlx5_1"]

    def test_a_fabric_with_no_hca_up_is_not_reported_and_says_why(self, tmp_path: Path) -> None:
        report = read_fabrics("ib-east", ["mlx5_0"], tmp_path / "missing")
        assert report.fabrics == []
        assert report.warnings[0].startswith("fabric ib-east is configured but none of its HCAs (mlx5_0)")
        assert report.warnings[0].endswith("this node takes no multi-node replica")

    def test_a_node_given_no_fabric_reports_none_whatever_its_hcas(self, tmp_path: Path) -> None:
        _hca(tmp_path, "mlx5_0", "4: ACTIVE")
        assert read_fabrics("", [], tmp_path).fabrics == []


class TestStorage:
    def test_directories_on_one_filesystem_are_reported_once(self, tmp_path: Path) -> None:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        (storage,) = read_storage([tmp_path / "a", tmp_path / "b"])
        fs = os.statvfs(tmp_path)
        assert storage.path == str(tmp_path / "a")
        assert storage.total_bytes == fs.f_blocks * fs.f_frsize
        assert 0 < storage.free_bytes <= storage.total_bytes

    def test_a_weights_cache_not_made_yet_is_measured_where_it_will_be(self, tmp_path: Path) -> None:
        (storage,) = read_storage([tmp_path / "not" / "yet"])
        assert storage.path == str(tmp_path / "not" / "yet")
        assert storage.total_bytes > 0
