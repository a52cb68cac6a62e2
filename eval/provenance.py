"""What a result was measured on: machine, software versions and git state."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

VERSIONED = ("torch", "sglang", "transformers", "tokenizers", "sglang-ssd", "sgl-kernel")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _lscpu() -> dict[str, str]:
    text = _run(["lscpu"]) or ""
    wanted = (
        "Model name",
        "CPU(s)",
        "Thread(s) per core",
        "Core(s) per socket",
        "Socket(s)",
        "NUMA node(s)",
        "Flags",
    )
    info = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            info[key.strip()] = value.strip()
    flags = set(info.pop("Flags", "").split())
    info["isa"] = ",".join(sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2"))))
    return info


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key + "_kB"] = int(value.split()[0])
    except OSError:
        pass
    return out


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def machine_info() -> dict[str, Any]:
    """CPU model and ISA flags, core counts, memory, load, OS and package versions."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "lscpu": _lscpu(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "memory": _meminfo(),
        "loadavg": os.getloadavg(),
        "versions": versions(),
    }


def git_info(repo: Path | None = None) -> dict[str, Any]:
    """HEAD commit, branch and whether the working tree differs from it."""
    repo = repo or Path(__file__).resolve().parent.parent
    commit = (_run(["git", "rev-parse", "HEAD"], repo) or "").strip() or None
    status = _run(["git", "status", "--porcelain"], repo)
    changed = [line[3:] for line in (status or "").splitlines()]
    return {
        "commit": commit,
        "branch": (_run(["git", "rev-parse", "--abbrev-ref", "HEAD"], repo) or "").strip() or None,
        "dirty": bool(changed),
        "changed_paths": changed[:200],
    }


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()
