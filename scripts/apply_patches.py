"""Apply patches/*.patch to the installed SGLang, idempotently.

Each patch is a unified diff against the pinned SGLang wheel, with paths relative to
site-packages (`a/sglang/...`). A patch whose reverse applies cleanly is already in place and is
skipped; one that applies neither way stops the install with the patch's name.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def _patch(args: list[str], patch_file: Path, site: Path) -> bool:
    cmd = ["patch", "-p1", "--batch", "--silent", "-d", str(site), "-i", str(patch_file), *args]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def main() -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    patches = sorted((Path(__file__).resolve().parent.parent / "patches").glob("*.patch"))
    for patch_file in patches:
        if _patch(["--reverse", "--dry-run"], patch_file, site):
            print(f"[patches] {patch_file.name}: already applied")
        elif _patch(["--forward", "--dry-run"], patch_file, site):
            _patch(["--forward"], patch_file, site)
            print(f"[patches] {patch_file.name}: applied")
        else:
            print(f"[patches] {patch_file.name}: does not apply to this SGLang", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
