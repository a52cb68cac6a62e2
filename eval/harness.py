"""Run configurations against the same prompts, interleaved, and write one results JSON.

A configuration is data (`Config`): a name, launcher arguments, CPU pinning and environment.
`run_interleaved` starts one server per configuration and keeps them alive together when memory
allows (each with `--sleep-on-idle`: an idle SGLang scheduler otherwise spins a whole core and
steals it from the server being measured). Only one server runs requests at a time. The unit of
interleaving is one batch of b prompts: unit u goes to every configuration in turn, in forward
order for even u and reverse order for odd u (A B, B A, A B, ...), so slow drift of the machine
cancels between configurations. If the servers do not fit in memory together, each repeat starts
them one at a time instead (still alternating the order).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval import client, cpuload, provenance, ssd_stats
from eval.datasets import Prompt
from eval.servers import Server
from eval.summary import summarize

SCHEMA = "sglang-ssd-eval/1"
# Flags every server gets from the harness (see the module docstring).
HARNESS_ARGS: tuple[str, ...] = ("--sleep-on-idle",)
# Launcher defaults (sglang_ssd/launch_server.py) needed to describe a config without its flags.
LAUNCHER_DEFAULT_ALGORITHM = "STANDALONE"
LAUNCHER_DEFAULT_LOOKAHEAD = 4
# Memory of a server beyond its weight files (launcher, detokenizer and scheduler processes,
# an 8192-token KV pool, activations): about 2.5 GiB per server for the real pair on CPU.
SERVER_OVERHEAD_BYTES = 5 << 29


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in `args` (``--flag v`` or ``--flag=v``); the last one wins."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


@dataclass(frozen=True)
class Config:
    """One server configuration, as data.

    Attributes:
        name: unique label (table rows, result keys, log names).
        args: arguments for `python -m sglang_ssd.launch_server` (host and port are added).
        cpus: pin every process of the server to these CPUs (None: no pinning).
        threads: `OMP_NUM_THREADS` (default: ``len(cpus)`` when pinned, else unset).
        env: further environment overrides.
        notes: free text kept in the results (e.g. why a config is not lossless).
    """

    name: str
    args: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None
    threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""

    @property
    def algorithm(self) -> str:
        value = flag_value(self.args, "--speculative-algorithm") or LAUNCHER_DEFAULT_ALGORITHM
        return value.upper()

    @property
    def lookahead(self) -> int | None:
        """γ (`--speculative-num-steps`), None for autoregressive decoding."""
        if self.algorithm == "NONE":
            return None
        steps = flag_value(self.args, "--speculative-num-steps")
        return int(steps) if steps is not None else LAUNCHER_DEFAULT_LOOKAHEAD

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "args": list(self.args),
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "threads": self.threads,
            "env": dict(self.env),
            "notes": self.notes,
            "algorithm": self.algorithm,
            "lookahead": self.lookahead,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        cpus = d.get("cpus")
        return cls(
            name=d["name"],
            args=tuple(d.get("args", ())),
            cpus=tuple(cpus) if cpus is not None else None,
            threads=d.get("threads"),
            env=dict(d.get("env", {})),
            notes=d.get("notes", ""),
        )

    def server(self, log_dir: Path, extra_args: Sequence[str] = (), **kw: Any) -> Server:
        return Server(
            name=self.name,
            args=[*self.args, *extra_args],
            cpus=self.cpus,
            threads=self.threads,
            env=self.env,
            log_path=log_dir / f"{self.name}.log",
            **kw,
        )


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


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def fits_together(configs: Sequence[Config], margin: float = 0.8) -> bool:
    return sum(estimated_server_bytes(c) for c in configs) <= margin * available_bytes()


def interleaved_order(configs: Sequence[Config], unit: int) -> list[Config]:
    """Forward order for even units, reverse for odd ones."""
    return list(configs) if unit % 2 == 0 else list(reversed(configs))


def _batches(prompts: Sequence[Prompt], size: int) -> list[list[Prompt]]:
    return [list(prompts[i : i + size]) for i in range(0, len(prompts), size)]


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


@dataclass
class RunSettings:
    """Everything about a run that is not a configuration."""

    sampling: client.Sampling = field(default_factory=client.Sampling)
    batch_size: int = 1
    repeats: int = 1
    warmup: bool = True
    flush_cache: bool = True
    stream: bool = False
    concurrent_servers: bool | None = None  # None: decide from free memory
    parallel_start: bool = True  # start concurrent servers at the same time
    extra_args: tuple[str, ...] = HARNESS_ARGS
    startup_timeout: float = 900.0
    # Before each unit, wait (up to quiet_max_wait_s) until at most this fraction of all CPUs is
    # busy; None: don't wait. Each batch records the CPU time other processes used meanwhile.
    quiet_threshold: float | None = None
    quiet_max_wait_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampling": vars(self.sampling) | {"greedy": self.sampling.greedy},
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "flush_cache": self.flush_cache,
            "stream": self.stream,
            "concurrent_servers": self.concurrent_servers,
            "parallel_start": self.parallel_start,
            "extra_args": list(self.extra_args),
            "quiet_threshold": self.quiet_threshold,
            "quiet_max_wait_s": self.quiet_max_wait_s,
        }


def oom_killed(pids: Sequence[int]) -> list[int]:
    """Which of `pids` the kernel's OOM killer ended (from dmesg; empty if unreadable)."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [p for p in pids if f"Killed process {p} " in log]


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
        return {k: v for k, v in settings.items() if k not in loose}

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


class RequestFailed(RuntimeError):
    """A request returned an error; the partial results were written first."""


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
    """
    settings = settings or RunSettings()
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique: {names}")
    concurrent = settings.concurrent_servers
    if concurrent is None:
        concurrent = fits_together(configs)
    results: dict[str, Any] = {
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
    if resume and out_path is not None and out_path.exists():
        _resume_into(results, json.loads(out_path.read_text()))
    done = {(b["config"], b["repeat"], b["unit"]) for b in results["batches"]}
    by_name = {c["name"]: c for c in results["configs"]}
    batches = _batches(prompts, settings.batch_size)

    def save() -> None:
        if out_path is not None:
            _write_json(out_path, results)

    def run_unit(server: Server, config: Config, repeat: int, unit: int, batch: list[Prompt]):
        if (config.name, repeat, unit) in done:
            return
        if settings.flush_cache:
            client.flush_cache(server.url)
        waited = 0.0
        if settings.quiet_threshold is not None:
            waited = cpuload.wait_until_quiet(
                settings.quiet_threshold, settings.quiet_max_wait_s, cpus=config.cpus
            )
        load_before = provenance.loadavg()[0]
        pids = [p["pid"] for p in server.processes()]
        cpu_before = cpuload.CpuSample.take(pids, config.cpus)
        ssd_before = ssd_stats.fetch(server.url) if config.algorithm == "SSD" else None
        res = client.generate_batch(
            server.url,
            [(p.id, p.input_ids) for p in batch],
            settings.sampling,
            first_index=unit * settings.batch_size,
            stream=settings.stream,
        )
        results["batches"].append(
            {
                "config": config.name,
                "repeat": repeat,
                "unit": unit,
                "start": res.start,
                "wall_s": res.wall_s,
                "tokens": res.tokens,
                "tok_per_s": res.tokens / res.wall_s if res.wall_s > 0 else 0.0,
                "loadavg_1m_before": load_before,
                "waited_for_quiet_s": waited,
                **cpuload.cpu_delta(cpu_before, cpuload.CpuSample.take(pids, config.cpus)),
                "requests": [r.to_json() for r in res.requests],
            }
        )
        ssd_after = ssd_stats.fetch(server.url) if ssd_before is not None else None
        if ssd_before is not None and ssd_after is not None:
            # SSD's own per-round counters over this batch (cache hits, timers, acceptance).
            results["batches"][-1]["ssd"] = ssd_stats.delta(
                ssd_stats.totals(ssd_before), ssd_stats.totals(ssd_after)
            )
        errors = [r.error for r in res.requests if r.error]
        if progress:
            foreign = results["batches"][-1]["foreign_cpu_s"] / max(res.wall_s, 1e-9)
            progress(
                f"r{repeat} u{unit} {config.name}: {res.tokens} tok in {res.wall_s:.2f} s "
                f"({res.tokens / max(res.wall_s, 1e-9):.2f} tok/s, other processes used "
                f"{foreign:.2f} CPUs)"
            )
        if errors:
            alive = server.proc is not None and server.proc.poll() is None
            results["status"] = "failed"
            results["error"] = {
                "oom_killed": oom_killed([p["pid"] for p in server.info.get("processes", [])]),
                "config": config.name,
                "request_errors": errors,
                "server_alive": alive,
                "log_tail": server.log_tail(),
            }
            save()
            raise RequestFailed(f"{config.name}: {errors[0]}\n{server.log_tail()}")

    def new_server(config: Config) -> Server:
        return config.server(log_dir, settings.extra_args, startup_timeout=settings.startup_timeout)

    def ready(config: Config, server: Server) -> None:
        if settings.warmup:  # the first request after startup pays one-off costs
            warm = client.Sampling(max_new_tokens=8)
            client.generate(server.url, "warmup", prompts[0].input_ids, warm)
        if progress:
            progress(
                f"{config.name}: ready in {server.info['startup_s']:.0f} s "
                f"({server.info['command_line']})"
            )

    def start_all(stack: contextlib.ExitStack) -> dict[str, Server]:
        servers = {c.name: new_server(c) for c in configs}
        for server in reversed(servers.values()):
            stack.push(server)  # stopped on exit, also when a later start fails
        # Runs first on exit: all servers shut down at once instead of one after the other.
        stack.callback(lambda: [s.terminate() for s in servers.values()])
        workers = len(servers) if settings.parallel_start else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(s.start) for s in servers.values()]
        for config in configs:
            by_name[config.name]["servers"].append(servers[config.name].info)
        for f in futures:
            f.result()  # re-raise the first startup failure
        for config in configs:
            ready(config, servers[config.name])
        return servers

    def start_one(config: Config, stack: contextlib.ExitStack) -> Server:
        server = new_server(config)
        try:
            stack.enter_context(server)
        finally:
            by_name[config.name]["servers"].append(server.info)
        ready(config, server)
        return server

    try:
        todo = settings.repeats * len(batches) * len(configs) - len(done)
        if concurrent and todo > 0:
            with contextlib.ExitStack() as stack:
                servers = start_all(stack)
                save()
                unit = 0
                for repeat in range(settings.repeats):
                    for batch in batches:
                        for config in interleaved_order(configs, unit):
                            run_unit(servers[config.name], config, repeat, unit, batch)
                        save()
                        unit += 1
        elif todo > 0:
            for repeat in range(settings.repeats):
                for config in interleaved_order(configs, repeat):
                    units = range(repeat * len(batches), (repeat + 1) * len(batches))
                    if all((config.name, repeat, u) in done for u in units):
                        continue
                    with contextlib.ExitStack() as stack:
                        server = start_one(config, stack)
                        for j, batch in enumerate(batches):
                            run_unit(server, config, repeat, repeat * len(batches) + j, batch)
                        save()
    except BaseException as exc:
        if results["status"] == "running":
            results["status"] = "interrupted"
            results["error"] = {"exception": repr(exc)}
        results["finished_at"] = time.time()
        save()
        raise
    results["status"] = "complete"
    results["finished_at"] = time.time()
    results["machine"]["loadavg_end"] = provenance.loadavg()
    results["summary"] = summarize(results)
    save()
    return results
