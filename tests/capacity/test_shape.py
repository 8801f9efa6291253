"""A model's shape from its headers: GGUF of several quantisations and architectures, split, HF."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from llmgw.capacity.ggufmeta import GGML_TYPES, HeaderError, read_header
from llmgw.capacity.shape import read_shape
from tests.capacity.models import Q, write_gguf, write_hf_directory, write_safetensors


def test_the_ggml_type_table_is_ggufs_own():
    """A block size or byte count that drifts from ggml's would misstate every quantised model."""
    ours = {i: (block, size) for i, (_, block, size) in GGML_TYPES.items()}
    theirs = {int(t): v for t, v in gguf.constants.GGML_QUANT_SIZES.items() if int(t) in ours}
    assert ours == theirs
    assert {name for name, _, _ in GGML_TYPES.values()} <= {t.name for t in gguf.GGMLQuantizationType}


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.Q4_0])
def test_the_weight_bytes_are_the_tensor_bytes_the_file_holds(tmp_path: Path, qtype: Q):
    (path,) = write_gguf(tmp_path / "m.gguf", qtype=qtype)
    shape = read_shape(path)
    reader = gguf.GGUFReader(path)
    assert shape.weights_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert shape.files[0].quantisation.startswith(f"{qtype.name} ")
    # The file is its header, the tensors and alignment padding: the tensors are nearly all of it.
    assert shape.weights_bytes <= path.stat().st_size


@pytest.mark.parametrize(
    ("arch", "layers", "width", "heads", "kv_heads"),
    [("llama", 2, 256, 4, 4), ("qwen2", 3, 256, 8, 2), ("gemma", 4, 128, 4, 1)],
)
def test_the_kv_cache_per_token_follows_layers_kv_heads_and_head_dimension(
    tmp_path: Path, arch: str, layers: int, width: int, heads: int, kv_heads: int
):
    (path,) = write_gguf(
        tmp_path / "m.gguf", arch=arch, layers=layers, width=width, heads=heads, kv_heads=kv_heads
    )
    shape = read_shape(path)
    assert (shape.architecture, shape.layers) == (arch, layers)
    assert shape.k_per_token == shape.v_per_token == layers * kv_heads * (width // heads)
    assert shape.context_length == 2048


def test_a_split_model_is_read_whole_from_any_of_its_parts(tmp_path: Path):
    whole = read_shape(write_gguf(tmp_path / "whole.gguf", qtype=Q.Q4_K)[0])
    parts = write_gguf(tmp_path / "split.gguf", qtype=Q.Q4_K, split_max_tensors=5)
    assert len(parts) > 2
    shape = read_shape(parts[-1])
    assert [Path(f.path).name for f in shape.files] == [p.name for p in parts]
    assert shape.weights_bytes == whole.weights_bytes
    assert shape.k_per_token == whole.k_per_token


def test_a_split_model_missing_a_part_is_refused_naming_it(tmp_path: Path):
    parts = write_gguf(tmp_path / "split.gguf", split_max_tensors=5)
    parts[1].unlink()
    with pytest.raises(HeaderError, match=f"{parts[1].name} does not exist"):
        read_shape(parts[0])


def test_a_hugging_face_directory_is_read_from_config_and_safetensors_headers(tmp_path: Path):
    shape = read_shape(write_hf_directory(tmp_path / "hf", layers=2, hidden=128, kv_heads=1, head_dim=64))
    assert (shape.format, shape.architecture, shape.dtype_bytes) == ("safetensors", "LlamaForCausalLM", 2)
    assert [f.bytes for f in shape.files] == [512 * 128 * 2, 2 * 128 * 128 * 2]
    assert shape.k_per_token == 2 * 1 * 64


class TestRefusals:
    def test_a_missing_file_is_refused_in_words(self, tmp_path: Path):
        with pytest.raises(HeaderError, match="does not exist"):
            read_shape(tmp_path / "nothing.gguf")

    def test_a_truncated_header_is_refused_in_words(self, tmp_path: Path):
        (path,) = write_gguf(tmp_path / "m.gguf")
        path.write_bytes(path.read_bytes()[:3000])
        with pytest.raises(
            HeaderError, match=r"ends inside its GGUF header .* truncated, or still downloading"
        ):
            read_header(path)

    def test_a_file_that_is_not_gguf_is_refused_saying_how_it_starts(self, tmp_path: Path):
        path = tmp_path / "m.gguf"
        path.write_bytes(b"<html>not found</html>")
        with pytest.raises(HeaderError, match=r"is not a GGUF file \(it starts b'<htm'"):
            read_shape(path)

    def test_a_damaged_count_is_refused_rather_than_read_for_hours(self, tmp_path: Path):
        path = tmp_path / "m.gguf"
        path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1 << 60).to_bytes(8, "little") + bytes(8))
        with pytest.raises(HeaderError, match="header is damaged"):
            read_shape(path)

    def test_a_truncated_safetensors_header_is_refused_in_words(self, tmp_path: Path):
        directory = write_hf_directory(tmp_path / "hf")
        shard = directory / "model-00001-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:20])
        with pytest.raises(HeaderError, match="ends inside its safetensors header"):
            read_shape(directory)

    def test_a_gguf_without_tensors_is_a_vocabulary_not_a_model(self, tmp_path: Path):
        # Its header states 2 layers, a context and a vocabulary, as llama.cpp's ggml-vocab files do.
        (path,) = write_gguf(tmp_path / "ggml-vocab-llama.gguf", tensors=False)
        with pytest.raises(
            HeaderError, match=r"ggml-vocab-llama\.gguf holds no tensors: it is a vocabulary or metadata file"
        ):
            read_shape(path)

    def test_a_directory_without_config_is_not_a_hugging_face_model(self, tmp_path: Path):
        write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4, 4])})
        with pytest.raises(HeaderError, match=r"has no config\.json"):
            read_shape(tmp_path)
