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
from typing import Any, TypeVar

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
T = TypeVar("T")
# Running servers for the given configurations, keyed by `Config.server_name`; the caller owns them.
ServerProvider = Callable[[Sequence["Config"]], Mapping[str, Server]]


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
        share: name of the server this configuration runs on; configurations with the same
            `share` (and identical args, CPUs and environment) run on one server. None: its own.
        admin: SSD run-time settings (`POST /ssd/config`) applied before each of its units.
    """

    name: str
    args: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None
    threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    share: str | None = None
    admin: Mapping[str, Any] | None = None

    @property
    def server_name(self) -> str:
        """The server this configuration runs on (its log file is named after it)."""
        return self.share or self.name

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
        out = {
            "name": self.name,
            "args": list(self.args),
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "threads": self.threads,
            "env": dict(self.env),
            "notes": self.notes,
            "algorithm": self.algorithm,
            "lookahead": self.lookahead,
        }
        # Only when set, so results written before these fields existed still resume.
        if self.share is not None:
            out["share"] = self.share
        if self.admin is not None:
            out["admin"] = dict(self.admin)
        return out

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
            share=d.get("share"),
            admin=d.get("admin"),
        )

    def same_server(self, other: Config) -> bool:
        """Whether `other` starts exactly the same server (args, pinning, environment)."""
        return (self.args, self.cpus, self.threads, dict(self.env)) == (
            other.args, other.cpus, other.threads, dict(other.env)
        )  # fmt: skip

    def server(self, log_dir: Path, extra_args: Sequence[str] = (), **kw: Any) -> Server:
        return Server(
            name=self.server_name,
            args=[*self.args, *extra_args],
            cpus=self.cpus,
            threads=self.threads,
            env=self.env,
            log_path=log_dir / f"{self.server_name}.log",
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
    first = {c.server_name: c for c in reversed(configs)}  # one per server
    return sum(estimated_server_bytes(c) for c in first.values()) <= margin * available_bytes()


def interleaved_order(items: Sequence[T], unit: int) -> list[T]:
    """Forward order for even units, reverse for odd ones."""
    return list(items) if unit % 2 == 0 else list(reversed(items))


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
        applied = ssd_stats.configure(server.url, config.admin) if config.admin else None
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
        record = results["batches"][-1]
        if applied is not None:
            record["admin"] = applied  # the settings in force, as the server reports them
        ssd_after = ssd_stats.fetch(server.url) if ssd_before is not None else None
        if ssd_before is not None and ssd_after is not None:
            # SSD's own per-round counters over this batch (cache hits, timers, acceptance).
            record["ssd"] = ssd_stats.delta(
                ssd_stats.totals(ssd_before), ssd_stats.totals(ssd_after)
            )
            if ssd_after.get("fallback"):  # the miss policy's view after it (b*, estimates)
                record["fallback"] = ssd_after["fallback"]
        if on_batch:
            on_batch(record)
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
                f"{config.server_name}: ready in {server.info['startup_s']:.0f} s "
                f"({server.info['command_line']})"
            )

    def record_servers(running: Mapping[str, Server]) -> None:
        for config in configs:
            if config.server_name in running:
                by_name[config.name]["servers"].append(running[config.server_name].info)

    def start_all(stack: contextlib.ExitStack) -> dict[str, Server]:
        if servers is not None:
            running = dict(servers([members[0] for members in groups.values()]))
            record_servers(running)
        else:
            running = {key: new_server(members[0]) for key, members in groups.items()}
            for server in reversed(running.values()):
                stack.push(server)  # stopped on exit, also when a later start fails
            # Runs first on exit: all servers shut down at once instead of one after the other.
            stack.callback(lambda: [s.terminate() for s in running.values()])
            workers = len(running) if settings.parallel_start else 1
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(s.start) for s in running.values()]
            record_servers(running)
            for f in futures:
                f.result()  # re-raise the first startup failure
        for key, members in groups.items():
            ready(members[0], running[key])
        return running

    def start_one(members: Sequence[Config], stack: contextlib.ExitStack) -> Server:
        server = new_server(members[0])
        try:
            stack.enter_context(server)
        finally:
            record_servers({members[0].server_name: server})
        ready(members[0], server)
        return server

    try:
        todo = settings.repeats * len(batches) * len(configs) - len(done)
        if concurrent and todo > 0:
            with contextlib.ExitStack() as stack:
                running = start_all(stack)
                save()
                unit = 0
                for repeat in range(settings.repeats):
                    for batch in batches:
                        for config in interleaved_order(configs, unit):
                            run_unit(running[config.server_name], config, repeat, unit, batch)
                        save()
                        unit += 1
        elif todo > 0:
            for repeat in range(settings.repeats):
                for key in interleaved_order(list(groups), repeat):
                    members = groups[key]
                    units = range(repeat * len(batches), (repeat + 1) * len(batches))
                    if all((c.name, repeat, u) in done for c in members for u in units):
                        continue
                    with contextlib.ExitStack() as stack:
                        server = start_one(members, stack)
                        for unit, batch in zip(units, batches, strict=True):
                            for config in interleaved_order(members, unit):
                                run_unit(server, config, repeat, unit, batch)
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
