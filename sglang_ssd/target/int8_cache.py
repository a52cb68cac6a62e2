"""The target's int8 weights cached beside its checkpoint, keyed on the checkpoint and method.

One safetensors file per (checkpoint, method version, tensor-parallel shard) in
`<model folder>/.sglang-ssd-int8/`. The key hashes the method's version and the name, size and
modification time of every weight and config file of the folder, so replacing a shard or
changing the quantisation rebuilds the cache; older files of the folder are deleted then. A
folder that cannot be written (a read-only mount) is served without a cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

FOLDER = ".sglang-ssd-int8"
_KEYED = ("*.safetensors", "*.bin", "*.pt", "config.json")


def cache_key(model_dir: Path, method: str, shard: str) -> str:
    """Hex key of the checkpoint files in `model_dir`, the method (name and version) and the
    shard ("tp0of1"). Raises FileNotFoundError if `model_dir` has no weight files."""
    files = sorted({p for pattern in _KEYED for p in model_dir.glob(pattern)})
    if not any(p.name != "config.json" for p in files):
        raise FileNotFoundError(f"{model_dir}: no weight files to key an int8 cache on")
    digest = hashlib.sha256(f"{method}|{shard}".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"|{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


class Int8Cache:
    """The cache file of one model load.

    Args:
        model_dir: the checkpoint's folder.
        method: the method's name and version, e.g. "ssd_int8-v1".
        shard: which tensor-parallel shard this process loads, e.g. "tp0of1".

    Attributes:
        path: the cache file (it may not exist yet).
        hit: whether it existed, complete, when the load began.
    """

    def __init__(self, model_dir: Path, method: str, shard: str) -> None:
        self.dir = model_dir / FOLDER
        self.path = self.dir / f"{cache_key(model_dir, method, shard)}-{shard}.safetensors"
        self.hit = self.path.is_file()
        self._file = safe_open(str(self.path), "pt") if self.hit else None
        self._names = set(self._file.keys()) if self._file is not None else set()
        self._new: dict[str, torch.Tensor] = {}

    def get(self, name: str) -> torch.Tensor | None:
        """Tensor `name` from the cache file, or None on a miss."""
        if self._file is None or name not in self._names:
            return None
        return self._file.get_tensor(name)

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Keep `tensor` for `save` (a reference, not a copy)."""
        self._new[name] = tensor

    def save(self) -> Path | None:
        """Write the tensors `put` since the load began (atomically: a temporary file renamed
        into place), delete the folder's older cache files of this shard, and return the path;
        None, with a warning, when the folder cannot be written."""
        if not self._new:
            return None
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        try:
            self.dir.mkdir(exist_ok=True)
            save_file(self._new, str(tmp))
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning("int8 target: not cached (%s); the next start quantises again", exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return None
        shard = self.path.name.split("-", 1)[1]
        for old in self.dir.glob(f"*-{shard}"):
            if old != self.path:
                old.unlink(missing_ok=True)
        self._new.clear()
        return self.path
