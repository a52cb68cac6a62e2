"""SSD fields in SGLang's decode log line and Prometheus metrics (scheduler process).

A hook around `SchedulerMetricsReporter.report_decode_stats` computes, on the calls where SGLang
reports (every `--decode-log-interval` decode rounds), the SSD window since the previous report
from the worker's `RoundTimer`: cache hit rate, mean wait for drafts and mean verify time per
round, and T_p: the speculator's round (its three largest phases named) against the target's
round without the wait (both from `sglang_ssd.phases`). A logging filter appends them to the
"Decode batch ..." line that call logs, and with `--enable-metrics` they are set on
prometheus_client gauges named ``sglang:ssd_*`` with SGLang's labels. Like SGLang's own gauges
they use `multiprocess_mode="mostrecent"`, so the main process's `/metrics` aggregates them from
`PROMETHEUS_MULTIPROC_DIR`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang_ssd.integration.registration import is_ssd
from sglang_ssd.phases import largest
from sglang_ssd.worker.metrics import RoundStats

if TYPE_CHECKING:
    from sglang_ssd.worker.metrics import RoundTimer
    from sglang_ssd.worker.planner import RoundPlanner
    from sglang_ssd.worker.speculator_client import SpeculatorClient

DECODE_LOGGER = "sglang.srt.managers.scheduler_components.metrics_reporter"
GAUGES: dict[str, str] = {
    "cache_hit_rate": "Fraction of SSD request-rounds whose draft was a speculation-cache hit.",
    "wait_draft_seconds": "Mean time per SSD round the target waited for drafts.",
    "verify_seconds": "Mean time per SSD round from drafts in hand to the round recorded "
    "(verify batch, forward, verify, commit, record).",
    "forward_seconds": "Mean time per SSD round building the verify batch and running the "
    "target's verify forward.",
    "backup_rate": "Fraction of SSD request-rounds drafted by a backup (cache miss).",
    "speculator_round_seconds": "Mean seconds of the speculator's work per Drafts it sent.",
    "target_round_seconds": "Mean seconds per SSD round of the target's work (no draft wait).",
    "t_p": "Speculator round / target round: above 1 the target waits for drafts.",
    "speculator_faults": "Speculator faults (timeouts, crashes) since the server started.",
    "speculator_restarts": "Speculator restarts since the server started.",
}


@dataclass
class Window:
    """SSD totals over the rounds since the previous decode report.

    Attributes:
        rounds: the target's speculative rounds in the window (`RoundStats` difference).
        speculator_rounds: Drafts received in the window.
        speculator_phases: the speculator's seconds by phase in the window.
        tree_depth: the D in force at the report (self-tuned or pinned); 0: unknown.
        plain_rounds: rounds without speculation in the window (`RoundPlanner.plain_rounds`).
        sync: `--ssd-mode sync`: the speculator drafts only when asked, so its round adds to
            the target's instead of hiding behind it, and the line names it "draft", not T_p
            (the gauges keep `t_p`: the same ratio).
        sync_rounds: speculative rounds of the window that were sync rounds (drafted just in
            time, so they too add the draft to the round; when every speculative round of the
            window was one, the line reads as under `sync`).
        arrangements: the arrangement held per batch-size bucket and the rates behind it
            (`RoundPlanner.describe`; "" before any was measured).
    """

    rounds: RoundStats = field(default_factory=RoundStats)
    speculator_rounds: int = 0
    speculator_phases: dict[str, float] = field(default_factory=dict)
    tree_depth: int = 0
    plain_rounds: int = 0
    sync: bool = False
    sync_rounds: int = 0
    arrangements: str = ""

    def values(self) -> dict[str, float]:
        """Per-round means and per-request-round rates (0 for an empty window), by gauge name."""
        stats = self.rounds
        rounds, requests = max(stats.rounds, 1), max(stats.requests, 1)
        spec_round = sum(self.speculator_phases.values()) / max(self.speculator_rounds, 1)
        target_round = stats.target_busy_s / rounds
        return {
            "cache_hit_rate": stats.hits / requests,
            "backup_rate": (stats.requests - stats.hits) / requests if stats.requests else 0.0,
            "wait_draft_seconds": stats.wait_draft_s / rounds,
            "verify_seconds": stats.verify_s / rounds,
            "forward_seconds": stats.forward_s / rounds,
            "speculator_round_seconds": spec_round,
            "target_round_seconds": target_round,
            "t_p": spec_round / target_round if target_round > 0 else 0.0,
        }

    def log_suffix(self) -> str:
        """The SSD part of the "Decode batch" line; a window without a speculative round says
        so (its plain rounds) instead of printing zeros for figures nothing measured."""
        if not self.rounds.rounds:
            suffix = f"ssd: no speculative round, plain rounds: {self.plain_rounds}"
            return suffix + (f", arrangement {self.arrangements}" if self.arrangements else "")
        v = self.values()
        suffix = (
            f"ssd hit rate: {v['cache_hit_rate']:.2f}, "
            f"wait draft: {v['wait_draft_seconds'] * 1e3:.1f} ms, "
            f"verify: {v['verify_seconds'] * 1e3:.1f} ms"
        )
        # Every round drafted just in time: no tree was built, and T_p would read as a
        # speculator falling behind (nothing overlaps).
        all_sync = self.sync or self.sync_rounds >= self.rounds.rounds
        if self.speculator_rounds and v["target_round_seconds"] > 0:
            means = {k: x / self.speculator_rounds for k, x in self.speculator_phases.items()}
            spec_ms = v["speculator_round_seconds"] * 1e3
            target_ms = v["target_round_seconds"] * 1e3
            if all_sync:
                suffix += f", sync draft: {spec_ms:.0f} ms ({largest(means)}) before each verify"
            else:
                suffix += (
                    f", T_p: {v['t_p']:.2f} (speculator {spec_ms:.0f} ms: {largest(means)};"
                    f" target {target_ms:.0f} ms)"
                )
        if self.tree_depth and not all_sync:
            suffix += f", D: {self.tree_depth}"
        if self.sync_rounds:
            suffix += f", sync rounds: {self.sync_rounds}"
        if self.plain_rounds:
            suffix += f", plain rounds: {self.plain_rounds}"
        if self.arrangements:
            suffix += f", arrangement {self.arrangements}"
        return suffix


@dataclass
class WindowTracker:
    """Turns running totals (the `RoundTimer`'s snapshot, the speculator's phases the client
    summed, the planner's plain rounds) into windows between reports: each a difference of two
    snapshots of the same structs `/ssd/stats` shows."""

    last: Window = field(default_factory=Window)

    def take(
        self,
        timer: RoundTimer,
        client: SpeculatorClient,
        planner: RoundPlanner,
        sync: bool = False,
    ) -> Window:
        """The window since the previous call (the first: since start); `planner` gives the D
        in force and the plain rounds chosen, `sync` whether the server runs `--ssd-mode sync`."""
        now = Window(
            rounds=timer.snapshot(),
            speculator_rounds=client.drafts_received,
            speculator_phases=dict(client.speculator_phases.seconds),
            tree_depth=planner.tree_depth,
            plain_rounds=planner.plain_rounds,
            sync_rounds=planner.sync_rounds_run,
        )
        last, self.last = self.last, now
        return Window(
            rounds=now.rounds - last.rounds,
            speculator_rounds=now.speculator_rounds - last.speculator_rounds,
            speculator_phases={
                k: v - last.speculator_phases.get(k, 0.0) for k, v in now.speculator_phases.items()
            },
            tree_depth=now.tree_depth,
            plain_rounds=now.plain_rounds - last.plain_rounds,
            sync=sync,
            sync_rounds=now.sync_rounds - last.sync_rounds,
            arrangements=planner.describe(),
        )


class DecodeLineFilter(logging.Filter):
    """Appends the pending SSD suffix to the next "Decode batch" record."""

    def __init__(self) -> None:
        super().__init__()
        self.suffix: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.suffix and isinstance(record.msg, str) and record.msg.startswith("Decode batch"):
            record.msg = f"{record.msg}, {self.suffix}"
            self.suffix = None
        return True


class DecodeReportState:
    """Per scheduler process: the window tracker, the log filter and the gauges."""

    def __init__(self) -> None:
        self.tracker = WindowTracker()
        self.filter = DecodeLineFilter()
        logging.getLogger(DECODE_LOGGER).addFilter(self.filter)
        self.gauges: dict[str, Any] | None = None

    def set_gauges(self, labels: dict[str, str], values: dict[str, float]) -> None:
        if self.gauges is None:
            from prometheus_client import Gauge

            self.gauges = {
                name: Gauge(
                    name=f"sglang:ssd_{name}",
                    documentation=doc,
                    labelnames=list(labels),
                    multiprocess_mode="mostrecent",
                )
                for name, doc in GAUGES.items()
            }
        for name, value in values.items():
            if name in self.gauges:
                self.gauges[name].labels(**labels).set(value)


_state: DecodeReportState | None = None


def report_decode_stats(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any):
    """Hook (AROUND `SchedulerMetricsReporter.report_decode_stats`), see the module docstring."""
    global _state
    due = reporter.forward_ct_decode % reporter.decode_log_interval == 0
    if not due or not is_ssd(reporter.scheduler.spec_algorithm):
        return original(reporter, *args, **kwargs)
    from sglang_ssd.worker.ssd_worker import SSDWorker

    worker = reporter.scheduler.draft_worker
    # TP ranks other than 0 hold no speculator client (`SSDWorker.leads`): SGLang's own report.
    if not isinstance(worker, SSDWorker) or worker.speculator_client is None:
        return original(reporter, *args, **kwargs)
    client, planner = worker.speculator_client, worker.planner
    if _state is None:
        _state = DecodeReportState()
    window = _state.tracker.take(worker.timer, client, planner, sync=worker.config.mode == "sync")
    _state.filter.suffix = window.log_suffix()
    try:
        return original(reporter, *args, **kwargs)
    finally:
        _state.filter.suffix = None
        collector = getattr(reporter, "metrics_collector", None)
        if reporter.current_scheduler_metrics_enabled and collector is not None:
            values = window.values()
            values["speculator_faults"] = float(client.supervisor.faults)
            values["speculator_restarts"] = float(client.supervisor.restarts)
            _state.set_gauges(dict(collector.labels), values)
