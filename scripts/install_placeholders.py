"""Put patches/placeholders (import-only torchvision) on the venv's path with a .pth file.

Only where torchvision cannot be imported: PyPI's torchvision fails beside the CPU build of torch,
and SGLang imports it from multimodal modules that text models never call. Idempotent.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_ssd_placeholders.pth"
MARKER = "sglang_ssd.placeholder"  # in every placeholder's __init__.py (its __version__)


def _is_placeholder(spec: importlib.machinery.ModuleSpec | None) -> bool:
    """Whether `spec` is a placeholder torchvision, from this checkout or any other."""
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin is not None and origin.is_file() and MARKER in origin.read_text(errors="ignore")


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    placeholders = (Path(__file__).resolve().parent.parent / "patches" / "placeholders").resolve()
    if pth.exists():
        pth.unlink()
    # This interpreter read the old .pth at start-up: look for torchvision without it, or the
    # placeholder would pass for a real torchvision and a reinstall would drop the .pth. A
    # placeholder found anyway (another checkout's, on PYTHONPATH) is not a real torchvision.
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != placeholders]
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("torchvision")
    if spec is not None and not _is_placeholder(spec):
        print("[placeholders] real torchvision present; no placeholder")
        return
    pth.write_text(f"{placeholders}\n")
    print(f"[placeholders] {pth} -> {placeholders}")


if __name__ == "__main__":
    main()
