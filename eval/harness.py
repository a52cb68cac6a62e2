"""Run configurations against the same prompts, interleaved, and write one results JSON.

A configuration is data (`Config`): a name, launcher arguments, CPU pinning and environment.
`run_interleaved` starts one server per configuration and keeps them alive together when memory
allows (each with `--sleep-on-idle`: an idle SGLang scheduler otherwise spins a whole core and
steals it from the server being measured). Only one server runs requests at a time. The unit of
interleaving is one batch of b prompts: unit u goes to every configuration in turn, in forward
order for even u and reverse order for odd u (A B, B A, A B, ...), so slow drift of the machine
cancels between configurations. If the servers do not fit in memory together, each repeat starts
them one at a time instead (still alternating the order).

Sweeps over SSD's run-time settings share one server: configurations with the same `share` run on
one server (started from the first of them), and each carries `admin` settings that the harness
posts to `/ssd/config` before every unit of that configuration. A caller can also hand in servers
it keeps alive across several runs (`servers=`), so a sweep needs no restart at all.

This module decides what a run is (settings, server groups, whether servers fit together, the
results document, resuming); `eval.interleave` runs its units.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from eval import provenance
from eval.configs import Config
from eval.datasets import Prompt
from eval.interleave import InterleavedRun
from eval.results_io import read_results
from eval.run_settings import RunSettings, ServerProvider
from eval.summary import summarize
from sglang_ssd.launch_server import flag_value

SCHEMA = "sglang-ssd-eval/1"
# Memory of a server beyond its weight files (launcher, detokenizer and scheduler processes,
# an 8192-token KV pool, activations): about 2.5 GiB per server for the real pair on CPU.
SERVER_OVERHEAD_BYTES = 5 << 29


def estimated_server_bytes(config: Config) -> int:
    """Weights of the target (and draft) folders named in the args, plus a fixed overhead."""
    total = SERVER_OVERHEAD_BYTES
    for flag in ("--model-path", "--speculative-draft-model-path"):
        path = flag_value(config.args, flag)
        if path and Path(path).is_dir():
            total += sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
        elif flag == "--model-path" or config.algorithm != "NONE":
            total += 4 << 30  # unknown (launcher default): assume the real bf16 pair's size
    return total


def fits_together(configs: Sequence[Config], margin: float = 0.8) -> bool:
    """Whether one server per `Config.server_name` fits in `margin` of the available memory."""
    first = {c.server_name: c for c in reversed(configs)}  # one per server
    available = psutil.virtual_memory().available
    return sum(estimated_server_bytes(c) for c in first.values()) <= margin * available


def server_groups(configs: Sequence[Config]) -> dict[str, list[Config]]:
    """Configurations by the server they run on, in order of first appearance.

    Raises:
        ValueError: if configurations sharing a server differ in how it is started, or one of
            several sharing it has no `admin` settings (it would inherit the previous ones).
    """
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(c.server_name, []).append(c)
    for key, members in groups.items():
        if any(not m.same_server(members[0]) for m in members[1:]):
            raise ValueError(f"configurations sharing server {key!r} differ in args, CPUs or env")
        if len(members) > 1 and any(m.admin is None for m in members):
            raise ValueError(f"each configuration sharing server {key!r} needs `admin` settings")
    return groups


def _resume_into(results: dict[str, Any], previous: Mapping[str, Any]) -> None:
    """Carry an earlier run's batches and server records into `results`, if it is the same run.

    Raises:
        ValueError: naming what differs (configurations, prompts or settings).
    """

    def strip(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "servers"} for c in configs]

    def comparable(settings: Mapping[str, Any]) -> dict[str, Any]:
        # How servers are kept and how long to wait for quiet don't change what is measured.
        loose = ("concurrent_servers", "parallel_start", "quiet_threshold", "quiet_max_wait_s")
        out = {k: v for k, v in settings.items() if k not in loose}
        # Files written before stop strings and unit sizes existed had neither: the defaults.
        out["sampling"] = {"stop": []} | dict(out.get("sampling", {}))
        out["sampling"]["stop"] = list(out["sampling"]["stop"])
        out["unit_sizes"] = list(out.get("unit_sizes", []))
        return out

    checks = {
        "schema": (previous.get("schema"), results["schema"]),
        "configs": (strip(previous.get("configs", [])), strip(results["configs"])),
        "prompts": (previous.get("prompts"), results["prompts"]),
        "settings": (comparable(previous.get("settings", {})), comparable(results["settings"])),
    }
    differ = [name for name, (old, new) in checks.items() if old != new]
    if differ:
        raise ValueError(f"cannot resume: the earlier run differs in {', '.join(differ)}")
    results["batches"] = list(previous["batches"])
    results["created_at"] = previous["created_at"]
    results["resumed"] = [*previous.get("resumed", []), {"at": time.time(), "git": results["git"]}]
    results["git"] = previous["git"]
    for new, old in zip(results["configs"], previous["configs"], strict=True):
        new["servers"] = list(old.get("servers", []))


def run_interleaved(
    configs: Sequence[Config],
    prompts: Sequence[Prompt],
    settings: RunSettings | None = None,
    *,
    log_dir: Path,
    out_path: Path | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    resume: bool = False,
    servers: ServerProvider | None = None,
    on_batch: Callable[[Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every prompt on every configuration, interleaved; return (and write) the results.

    Args:
        configs: configurations; the first is the reference for ratios and output identity.
        prompts: the prompts, sent as `input_ids`, identical for every configuration.
        settings: sampling, batch size, repeats, ...
        log_dir: server logs go here (one file per configuration).
        out_path: results JSON, rewritten after every unit so an interruption keeps what ran.
        metadata: extra keys stored under "experiment" (name, dataset provenance, ...).
        progress: called with a short line after each batch.
        resume: if `out_path` holds an unfinished run of the same configurations, prompts and
            settings, keep its batches and run only the missing ones.
        servers: running servers to use instead of starting them (called with the first
            configuration of each server, only if some unit is left to run); the caller stops them.
        on_batch: called with each new batch record.

    Raises:
        ValueError: on duplicate configuration names, inconsistent shared servers, or a
            `resume` of a different run.
        eval.interleave.RequestFailed: when a request returned an error (the results say
            which).
    """
    settings = settings or RunSettings()
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique: {names}")
    groups = server_groups(configs)
    concurrent = settings.concurrent_servers
    if servers is not None:
        concurrent = True
    elif concurrent is None:
        concurrent = fits_together(configs)
    results = _new_results(configs, prompts, settings, metadata, concurrent)
    if resume and out_path is not None and out_path.exists():
        _resume_into(results, read_results(out_path))
    run = InterleavedRun(
        configs, groups, prompts, settings, results,
        log_dir=log_dir, out_path=out_path, progress=progress, servers=servers, on_batch=on_batch,
    )  # fmt: skip
    try:
        if run.todo() > 0 and concurrent:
            run.run_concurrent()
        elif run.todo() > 0:
            run.run_sequential()
    except BaseException as exc:
        if results["status"] == "running":
            results["status"] = "interrupted"
            results["error"] = {"exception": repr(exc)}
        results["finished_at"] = time.time()
        run.save()
        raise
    results["status"] = "complete"
    results["finished_at"] = time.time()
    results["machine"]["loadavg_end"] = provenance.loadavg()
    results["summary"] = summarize(results)
    run.save()
    return results


def _new_results(
    configs: Sequence[Config],
    prompts: Sequence[Prompt],
    settings: RunSettings,
    metadata: Mapping[str, Any] | None,
    concurrent: bool,
) -> dict[str, Any]:
    """The results document of a run that has not measured anything yet."""
    return {
        "schema": SCHEMA,
        "status": "running",
        "experiment": dict(metadata or {}),
        "created_at": time.time(),
        "git": provenance.git_info(),
        "machine": provenance.machine_info(),
        "settings": settings.to_dict() | {"concurrent_servers": concurrent},
        "prompts": [p.describe() for p in prompts],
        "configs": [c.to_dict() | {"servers": []} for c in configs],
        "batches": [],
    }
