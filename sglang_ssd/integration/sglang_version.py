"""The one SGLang release sglang-ssd supports, checked at startup.

SSD reaches into SGLang's scheduler, speculative registry and CUDA attention backends at the
attributes of one release (`tests/integration/test_sglang_canary.py` pins the ones read); on
another release those may be missing or mean something else, in ways that show only mid-serve.
So an SSD server refuses to start on any other version, naming both. The pin in
`requirements/sglang.txt` is the same string (a test checks).
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_SGLANG = "0.5.23"


def installed_sglang() -> str | None:
    """The installed `sglang` distribution's version, None when it is not installed."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def sglang_version_refusal(installed: str | None) -> str | None:
    """Why an SSD server must not start on SGLang `installed` (None: it may).

    The message names the supported and the installed version and how to install the former.
    """
    if installed == SUPPORTED_SGLANG:
        return None
    found = f"SGLang {installed}" if installed else "no SGLang"
    return (
        f"sglang-ssd supports SGLang {SUPPORTED_SGLANG} only; this environment has {found} "
        f"(`make install`; in an existing CUDA environment `pip install sglang=={SUPPORTED_SGLANG}`"
        f", which brings its CUDA stack, then `pip install --no-deps -e . -e kernels`: "
        f"docs/cuda.md)"
    )


def check_sglang_version() -> None:
    """Refuse to serve SSD on another SGLang release.

    Raises:
        ValueError: naming both versions (SGLang's server-args validation turns it into a
            startup error).
    """
    reason = sglang_version_refusal(installed_sglang())
    if reason is not None:
        raise ValueError(reason)
