"""An SSD server refuses an SGLang release other than the supported one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_ssd.integration import sglang_version
from sglang_ssd.integration.registration import validate_ssd_server_args
from sglang_ssd.integration.sglang_version import SUPPORTED_SGLANG, sglang_version_refusal

ROOT = Path(__file__).resolve().parents[1]


def test_the_supported_release_is_the_pinned_and_the_installed_one() -> None:
    pins = (ROOT / "requirements" / "sglang.txt").read_text().split()
    assert f"sglang=={SUPPORTED_SGLANG}" in pins
    assert sglang_version.installed_sglang() == SUPPORTED_SGLANG
    sglang_version.check_sglang_version()


@pytest.mark.parametrize("installed", ["0.5.24", "0.5.22", "0.5.23.post1", None])
def test_another_release_is_refused_naming_both(installed: str | None) -> None:
    reason = sglang_version_refusal(installed)
    assert reason is not None and f"SGLang {SUPPORTED_SGLANG}" in reason
    assert (f"SGLang {installed}" if installed else "no SGLang") in reason
    # The hint is CUDA's recipe (with SGLang's pinned CUDA stack), not the CPU's --no-deps one.
    assert f"pip install sglang=={SUPPORTED_SGLANG}`" in reason and "docs/cuda.md" in reason


def test_an_ssd_server_on_another_release_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's server-args validation (the registry's hook) raises it before anything else."""
    monkeypatch.setattr(sglang_version, "installed_sglang", lambda: "0.5.24")
    with pytest.raises(ValueError, match=r"supports SGLang 0\.5\.23 only.*has SGLang 0\.5\.24"):
        validate_ssd_server_args(SimpleNamespace())
