"""`scripts/install_placeholders.py` is idempotent: run again on a venv that already has the
placeholder on its path (a reinstall after an input changed), torchvision still imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install_placeholders.py"


def test_every_run_leaves_torchvision_importable() -> None:
    for run in range(2):
        subprocess.run([sys.executable, str(SCRIPT)], check=True, capture_output=True)
        probe = subprocess.run(
            [sys.executable, "-c", "import torchvision"], capture_output=True, text=True
        )
        assert probe.returncode == 0, (run, probe.stderr)
