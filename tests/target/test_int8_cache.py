"""The int8 cache beside the checkpoint (`sglang_ssd.target.int8_cache`): a hit after a save,
a rebuild when the checkpoint or the method changes (the stale file deleted), no cache where
the folder cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sglang_ssd.target.int8_cache import FOLDER, Int8Cache, cache_key

METHOD, SHARD = "ssd_int8-v1", "tp0of1"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    return tmp_path


def _fill(cache: Int8Cache) -> dict[str, torch.Tensor]:
    tensors = {"layer.qweight": torch.ones(3, 4, dtype=torch.int8), "layer.scale": torch.rand(3)}
    for name, tensor in tensors.items():
        cache.put(name, tensor)
    return tensors


def test_a_saved_cache_is_hit_by_the_next_load(checkpoint: Path) -> None:
    first = Int8Cache(checkpoint, METHOD, SHARD)
    assert not first.hit and first.get("layer.qweight") is None
    tensors = _fill(first)
    assert first.save() == first.path and first.path.parent == checkpoint / FOLDER
    second = Int8Cache(checkpoint, METHOD, SHARD)
    assert second.hit and second.path == first.path
    for name, tensor in tensors.items():
        assert torch.equal(second.get(name), tensor)
    assert second.get("other.qweight") is None


def test_the_key_changes_with_the_checkpoint_the_method_and_the_shard(checkpoint: Path) -> None:
    key = cache_key(checkpoint, METHOD, SHARD)
    assert cache_key(checkpoint, "ssd_int8-v2", SHARD) != key
    assert cache_key(checkpoint, METHOD, "tp1of2") != key
    weights = checkpoint / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert cache_key(checkpoint, METHOD, SHARD) != key
    (checkpoint / "tokenizer.json").write_text("{}")  # not a weight or config file
    assert cache_key(checkpoint, METHOD, SHARD) == cache_key(checkpoint, METHOD, SHARD)
    with pytest.raises(FileNotFoundError, match="no weight files"):
        cache_key(checkpoint / FOLDER, METHOD, SHARD)


def test_a_rebuild_deletes_the_stale_file(checkpoint: Path) -> None:
    old = Int8Cache(checkpoint, METHOD, SHARD)
    _fill(old)
    old.save()
    (checkpoint / "model.safetensors").write_bytes(b"new weights")  # size changes
    new = Int8Cache(checkpoint, METHOD, SHARD)
    assert not new.hit
    _fill(new)
    new.save()
    assert sorted((checkpoint / FOLDER).iterdir()) == [new.path]


def test_an_unwritable_folder_serves_without_a_cache(checkpoint: Path, caplog) -> None:
    (checkpoint / FOLDER).write_text("a file where the folder would go")
    cache = Int8Cache(checkpoint, METHOD, SHARD)
    _fill(cache)
    assert cache.save() is None and "not cached" in caplog.text
    assert not list(checkpoint.glob(f"{FOLDER}*.tmp*"))
