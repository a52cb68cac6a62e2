"""What a result was measured on: machine, software versions, git state and model folders."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

VERSIONED = ("torch", "sglang", "transformers", "tokenizers", "sglang-ssd", "sgl-kernel")
# Environment variables that cap the instruction set the kernels use below what lscpu reports:
# torch's own kernels, oneDNN (bf16/fp32 linear), MKL and FBGEMM (the int8 draft runtime). With
# all four at AVX2 an AVX-512 machine runs the AVX2 code paths (an emulated AVX2-only machine:
# same cores and memory, so its figures are not the AVX2 machine's).
ISA_CAPS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)


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
    memory = psutil.virtual_memory()
    return {"MemTotal_kB": memory.total // 1024, "MemAvailable_kB": memory.available // 1024}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def isa_caps() -> dict[str, str]:
    """The `ISA_CAPS` variables set in this process's environment (empty: none capped)."""
    return {name: os.environ[name] for name in ISA_CAPS if name in os.environ}


def machine_info() -> dict[str, Any]:
    """CPU model and ISA flags, core counts, memory, load, OS and package versions, and the
    instruction-set caps in force (`isa_caps`)."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "lscpu": _lscpu(),
        "isa_caps": isa_caps(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "memory": _meminfo(),
        "loadavg": os.getloadavg(),
        "versions": versions(),
    }


def cpu_summary() -> dict[str, Any]:
    """The short machine description of the micro-benchmarks: CPU model, logical CPUs, torch,
    Python and OS."""
    return {
        "cpu": _lscpu().get("Model name") or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "torch": versions()["torch"],
        "python": platform.python_version(),
        "platform": platform.platform(),
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


def model_info(path: Path) -> dict[str, Any]:
    """Path, sha256 of config.json and the pull record (GGUF sha256) of a model folder."""
    info: dict[str, Any] = {
        "path": str(path),
        "config_sha256": hashlib.sha256((path / "config.json").read_bytes()).hexdigest(),
    }
    pull = path / "sglang_ssd_pull.json"
    if pull.is_file():
        info["pull"] = json.loads(pull.read_text())
    return info


def run_header(module: str, argv: Sequence[str]) -> dict[str, Any]:
    """What every offline tool's results file starts with: its command line, the date, the
    machine and the git state."""
    return {
        "command": [sys.executable, "-m", module, *argv],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "git": git_info(),
    }
