"""Put patches/placeholders (import-only torchvision) on the venv's path with a .pth file.

Only where torchvision cannot be imported: PyPI's torchvision fails beside the CPU build of torch,
and SGLang imports it from multimodal modules that text models never call. Idempotent.
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_ssd_placeholders.pth"


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    placeholders = (Path(__file__).resolve().parent.parent / "patches" / "placeholders").resolve()
    if pth.exists():
        pth.unlink()
    # This interpreter read the old .pth at start-up: look for torchvision without it, or the
    # placeholder would pass for a real torchvision and a reinstall would drop the .pth.
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != placeholders]
    importlib.invalidate_caches()
    if importlib.util.find_spec("torchvision") is not None:
        print("[placeholders] real torchvision present; no placeholder")
        return
    pth.write_text(f"{placeholders}\n")
    print(f"[placeholders] {pth} -> {placeholders}")


if __name__ == "__main__":
    main()
