"""Where converted models live, and how a folder becomes visible only once complete.

Layout under `models_root()` (`$SGLANG_SSD_HOME/models`, default `~/.cache/sglang_ssd/models`):

    <name>/                       the Hugging Face folder, complete (holds MARKER_NAME)
    .staging-<name>-<random>/     work in progress: parts, GGUF, the folder being written
    .<name>.lock                  serialises concurrent pulls of one model

A folder counts as present only if its marker names the pinned GGUF sha256. The marker is written
inside the staging folder, which is then renamed into place, so an interrupted pull leaves at most a
staging folder (removed by the next pull) and never a half folder that looks complete.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .registry import ModelSpec

MARKER_NAME = "sglang_ssd_pull.json"
MARKER_FORMAT = 1


def home() -> Path:
    """The project's cache root: `$SGLANG_SSD_HOME`, default `~/.cache/sglang_ssd`."""
    return Path(os.environ.get("SGLANG_SSD_HOME") or Path.home() / ".cache" / "sglang_ssd")


def models_root() -> Path:
    """Folder holding one subfolder per converted model."""
    return home() / "models"


def model_dir(spec: ModelSpec) -> Path:
    """Final location of `spec`'s converted folder (it may not exist)."""
    return models_root() / spec.name


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's contents, or None if it is missing or unreadable."""
    try:
        return json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_present(spec: ModelSpec) -> bool:
    """Whether `spec`'s folder is complete and was converted from the pinned GGUF."""
    marker = read_marker(model_dir(spec))
    return (
        marker is not None
        and marker.get("format") == MARKER_FORMAT
        and marker.get("gguf_sha256") == spec.gguf_sha256
    )


def folder_bytes(folder: Path) -> int:
    """Total size in bytes of the regular files under `folder` (0 if it does not exist)."""
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@contextmanager
def model_lock(spec: ModelSpec) -> Iterator[None]:
    """Hold an exclusive lock for `spec` (blocks while another process pulls the same model)."""
    root = models_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{spec.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_stale_staging(spec: ModelSpec) -> None:
    """Delete staging folders left by interrupted pulls. Call only while holding `model_lock`."""
    for stale in models_root().glob(f".staging-{spec.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def staging(spec: ModelSpec) -> Iterator[Path]:
    """A fresh scratch folder next to the final one (same filesystem, so rename is atomic).

    Always removed on exit, whether the body succeeded (after `publish`) or raised.
    """
    root = models_root()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".staging-{spec.name}-", dir=root))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def publish(spec: ModelSpec, built: Path, work: Path, marker: dict[str, Any]) -> Path:
    """Write the marker into `built` and rename it to the final location.

    Args:
        spec: the model.
        built: the finished folder, inside the staging folder `work`.
        work: the staging folder; an outdated final folder is moved here to be deleted with it.
        marker: provenance to record (the format and pinned sha256 are added).

    Returns:
        The final folder.
    """
    record = {**marker, "format": MARKER_FORMAT, "gguf_sha256": spec.gguf_sha256}
    (built / MARKER_NAME).write_text(json.dumps(record, indent=2) + "\n")
    final = model_dir(spec)
    if final.exists():  # incomplete or outdated: a directory cannot be renamed onto a full one
        final.rename(work / "outdated")
    built.rename(final)
    return final
