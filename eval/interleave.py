"""The units of one interleaved run: servers up, each batch on each configuration in turn.

`eval.harness.run_interleaved` builds the results document and hands it to an `InterleavedRun`,
which brings the servers up (all together, or one server at a time when they do not fit in
memory), sends every unit it still lacks and appends one batch record per (configuration,
repeat, unit), rewriting the results file after every unit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from eval import client, cpuload, provenance, ssd_stats
from eval.configs import Config
from eval.datasets import Prompt
from eval.run_settings import RunSettings, ServerProvider
from eval.sampling import Sampling
from eval.servers import Server

T = TypeVar("T")
# The first request after startup pays one-off costs; this one is not measured.
WARMUP = Sampling(max_new_tokens=8)


class RequestFailed(RuntimeError):
    """A request returned an error; the partial results were written first."""


def interleaved_order(items: Sequence[T], unit: int) -> list[T]:
    """Forward order for even units, reverse for odd ones."""
    return list(items) if unit % 2 == 0 else list(reversed(items))


def oom_killed(pids: Sequence[int]) -> list[int]:
    """Which of `pids` the kernel's OOM killer ended (from dmesg; empty if unreadable)."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [p for p in pids if f"Killed process {p} " in log]


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write `data` to `path` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


class InterleavedRun:
    """Runs the units `results` lacks and records them in `results` (see the module docstring).

    Args:
        configs: the configurations, in the run's order.
        groups: the same configurations by the server they run on (`harness.server_groups`).
        prompts: the prompts, cut into units (`settings.units`).
        settings: the run's `run_settings.RunSettings`.
        results: the results document; batches already in it are not run again.
        log_dir: server logs (one file per server).
        out_path: where `save` writes `results` (None: nowhere).
        progress: called with a short line after each batch and server start.
        servers: running servers to use instead of starting them; the caller stops them.
        on_batch: called with each new batch record.
    """

    def __init__(
        self,
        configs: Sequence[Config],
        groups: Mapping[str, Sequence[Config]],
        prompts: Sequence[Prompt],
        settings: RunSettings,
        results: dict[str, Any],
        *,
        log_dir: Path,
        out_path: Path | None,
        progress: Callable[[str], None] | None,
        servers: ServerProvider | None,
        on_batch: Callable[[Mapping[str, Any]], None] | None,
    ) -> None:
        self.configs, self.groups, self.prompts = configs, groups, prompts
        self.settings, self.results = settings, results
        self.log_dir, self.out_path = log_dir, out_path
        self.progress, self.servers, self.on_batch = progress, servers, on_batch
        self.done = {(b["config"], b["repeat"], b["unit"]) for b in results["batches"]}
        self.by_name = {c["name"]: c for c in results["configs"]}
        self.units = settings.units(len(prompts))
        self.batches = [[prompts[i] for i in unit] for unit in self.units]

    def todo(self) -> int:
        """How many (configuration, repeat, unit) batches are still to run."""
        return self.settings.repeats * len(self.batches) * len(self.configs) - len(self.done)

    def save(self) -> None:
        if self.out_path is not None:
            write_json(self.out_path, self.results)

    # ------------------------------------------------------------------------- schedules
    def run_concurrent(self) -> None:
        """Every server alive at once; unit u goes to every configuration in turn."""
        with contextlib.ExitStack() as stack:
            running = self._start_all(stack)
            self.save()
            unit = 0
            for repeat in range(self.settings.repeats):
                for batch in self.batches:
                    for config in interleaved_order(self.configs, unit):
                        self._run_unit(running[config.server_name], config, repeat, unit, batch)
                    self.save()
                    unit += 1

    def run_sequential(self) -> None:
        """One server at a time, in alternating order per repeat."""
        n = len(self.batches)
        for repeat in range(self.settings.repeats):
            for key in interleaved_order(list(self.groups), repeat):
                members = self.groups[key]
                units = range(repeat * n, (repeat + 1) * n)
                if all((c.name, repeat, u) in self.done for c in members for u in units):
                    continue
                with contextlib.ExitStack() as stack:
                    server = self._start_one(members, stack)
                    for unit, batch in zip(units, self.batches, strict=True):
                        for config in interleaved_order(members, unit):
                            self._run_unit(server, config, repeat, unit, batch)
                    self.save()

    # ------------------------------------------------------------------------- servers
    def _new_server(self, config: Config) -> Server:
        s = self.settings
        return config.server(self.log_dir, s.extra_args, startup_timeout=s.startup_timeout)

    def _ready(self, config: Config, server: Server) -> None:
        if self.settings.warmup:
            client.generate(server.url, "warmup", self.prompts[0].input_ids, WARMUP)
        if self.progress:
            self.progress(
                f"{config.server_name}: ready in {server.info['startup_s']:.0f} s "
                f"({server.info['command_line']})"
            )

    def _record_servers(self, running: Mapping[str, Server]) -> None:
        for config in self.configs:
            if config.server_name in running:
                self.by_name[config.name]["servers"].append(running[config.server_name].info)

    def _start_all(self, stack: contextlib.ExitStack) -> dict[str, Server]:
        if self.servers is not None:
            running = dict(self.servers([members[0] for members in self.groups.values()]))
            self._record_servers(running)
        else:
            running = {key: self._new_server(members[0]) for key, members in self.groups.items()}
            for server in reversed(running.values()):
                stack.push(server)  # stopped on exit, also when a later start fails
            # Runs first on exit: all servers shut down at once instead of one after the other.
            stack.callback(lambda: [s.terminate() for s in running.values()])
            workers = len(running) if self.settings.parallel_start else 1
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(s.start) for s in running.values()]
            self._record_servers(running)
            for f in futures:
                f.result()  # re-raise the first startup failure
        for key, members in self.groups.items():
            self._ready(members[0], running[key])
        return running

    def _start_one(self, members: Sequence[Config], stack: contextlib.ExitStack) -> Server:
        server = self._new_server(members[0])
        try:
            stack.enter_context(server)
        finally:
            self._record_servers({members[0].server_name: server})
        self._ready(members[0], server)
        return server

    # ------------------------------------------------------------------------- one unit
    def _run_unit(
        self, server: Server, config: Config, repeat: int, unit: int, batch: Sequence[Prompt]
    ) -> None:
        """Prepare the server, send `batch`, append its record; raise on a failed request."""
        if (config.name, repeat, unit) in self.done:
            return
        applied, waited = self._prepare(server, config)
        res, record, ssd_before = self._measure(
            server, config, batch, repeat=repeat, unit=unit, waited=waited
        )
        self.results["batches"].append(record)
        if applied is not None:
            record["admin"] = applied  # the settings in force, as the server reports them
        if ssd_before is not None:
            _add_ssd_counters(record, server.url, ssd_before)
        if self.on_batch:
            self.on_batch(record)
        errors = [r.error for r in res.requests if r.error]
        if self.progress:
            foreign = record["foreign_cpu_s"] / max(res.wall_s, 1e-9)
            self.progress(
                f"r{repeat} u{unit} {config.name}: {res.tokens} tok in {res.wall_s:.2f} s "
                f"({res.tokens / max(res.wall_s, 1e-9):.2f} tok/s, other processes used "
                f"{foreign:.2f} CPUs)"
            )
        if errors:
            self._fail(server, config, errors)

    def _prepare(self, server: Server, config: Config) -> tuple[dict[str, Any] | None, float]:
        """Flush the cache, apply `config.admin`, wait for quiet; (settings in force, wait s)."""
        if self.settings.flush_cache:
            client.flush_cache(server.url)
        applied = ssd_stats.configure(server.url, config.admin) if config.admin else None
        waited = 0.0
        if self.settings.quiet_threshold is not None:
            waited = cpuload.wait_until_quiet(
                self.settings.quiet_threshold, self.settings.quiet_max_wait_s, cpus=config.cpus
            )
        return applied, waited

    def _measure(
        self,
        server: Server,
        config: Config,
        batch: Sequence[Prompt],
        *,
        repeat: int,
        unit: int,
        waited: float,
    ) -> tuple[client.BatchResult, dict[str, Any], dict[str, float] | None]:
        """Send `batch` to `server`, timing it and the machine's CPU around it.

        Returns:
            (the replies, the batch record, SSD's counter totals before it or None).
        """
        load_before = provenance.loadavg()[0]
        pids = [p["pid"] for p in server.processes()]
        cpu_before = cpuload.CpuSample.take(pids, config.cpus)
        ssd_before = ssd_stats.fetch(server.url) if config.algorithm == "SSD" else None
        res = client.generate_batch(
            server.url,
            [(p.id, p.input_ids) for p in batch],
            self.settings.sampling,
            first_index=self._first_index(unit),
            stream=self.settings.stream,
            samplings=[p.sampling or self.settings.sampling for p in batch],
        )
        record = {
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
        return res, record, ssd_stats.totals(ssd_before) if ssd_before is not None else None

    def _first_index(self, unit: int) -> int:
        """The run-wide index of the unit's first request (offsets a sampled run's seeds, so
        repeats differ); `unit` counts on across repeats."""
        repeat, within = divmod(unit, len(self.units))
        return repeat * len(self.prompts) + self.units[within].start

    def _fail(self, server: Server, config: Config, errors: Sequence[str | None]) -> None:
        """Record why the run stopped, save, and raise `RequestFailed`."""
        alive = server.proc is not None and server.proc.poll() is None
        self.results["status"] = "failed"
        self.results["error"] = {
            "oom_killed": oom_killed([p["pid"] for p in server.info.get("processes", [])]),
            "config": config.name,
            "request_errors": list(errors),
            "server_alive": alive,
            "log_tail": server.log_tail(),
        }
        self.save()
        raise RequestFailed(f"{config.name}: {errors[0]}\n{server.log_tail()}")


def _add_ssd_counters(record: dict[str, Any], url: str, before: Mapping[str, float]) -> None:
    """SSD's own per-round counters over the batch (cache hits, timers, acceptance), and the
    miss policy's view after it (b*, estimates) when the server reports one."""
    after = ssd_stats.fetch(url)
    if after is None:
        return
    record["ssd"] = ssd_stats.delta(before, ssd_stats.totals(after))
    if after.get("fallback"):
        record["fallback"] = after["fallback"]
