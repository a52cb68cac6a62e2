"""The paper's experiments on our pair, as plans of harness runs.

A `Plan` is one `run_interleaved` call: configurations, prompts, settings and the results file.

- ``main``: AR vs STANDALONE vs `--ssd-mode sync` vs SSD on HumanEval and MT-Bench prompts, equal
  hardware (`eval.ssd_bench`'s ``equal`` arrangement), greedy, batch 1.
- ``beta``: Saguaro sampling's β at T = 0.7 (β only changes sampled drafts).
- ``fanout``: geometric vs uniform fan-out at equal budget B, greedy.
- ``backup``: JIT vs n-gram vs random cache-miss backup (and ``auto``, the policy) at batch sizes
  1, 2, 4; each SSD batch records the policy's b* (`/ssd/stats` → ``fallback``).

Sweeps run without restarts: every point of a sweep is a `Config` that shares the SSD server and
carries its settings in ``admin`` (posted to `/ssd/config` before each of its units), and a
`ServerPool` keeps the AR and SSD servers alive across all sweep runs. Every point's settings name
all four live settings, so a point never inherits the previous run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eval import datasets, ssd_bench
from eval.configs import Config
from eval.datasets import Prompt
from eval.harness import run_interleaved
from eval.results_io import read_results
from eval.run_settings import HARNESS_ARGS, RunSettings
from eval.sampling import Sampling
from eval.servers import Server
from sglang_ssd.config import SSDConfig

SWEEPS = ("beta", "fanout", "backup")
# The live settings every sweep point names, at `SSDConfig`'s defaults; each point overrides some.
LIVE_DEFAULTS: dict[str, Any] = {
    key: getattr(SSDConfig(), key) for key in ("beta", "fanout_budget", "fanout", "backup")
}
AR, SSD = "AR-2c", "SSD-1+1c"  # the reference and SSD configurations (`ssd_bench`, equal)
SAMPLED = Sampling(temperature=0.7, seed=0)
# Assumed speeds of the real pair on this 2-core CPU, for the printed duration estimate only.
ASSUMED_TOK_PER_S = {
    "NONE": 2.0, "STANDALONE": 2.0, "sync": 2.0, "async": 4.0, "auto": 4.0, "plain": 2.0,
}  # fmt: skip
ASSUMED_STARTUP_S = 75.0


@dataclass(frozen=True)
class Scale:
    """How much each point measures: prompts x new tokens (at batch sizes up to `prompts`)."""

    prompts: int
    max_new_tokens: int
    betas: tuple[float, ...]
    budgets: tuple[int, ...]
    backups: tuple[str, ...]
    batch_sizes: tuple[int, ...] = (1, 2, 4)

    def for_batch(self, batch_size: int) -> tuple[int, int]:
        """(prompts, tokens) at `batch_size`: at least one full batch, same tokens per point."""
        n = max(self.prompts, batch_size)
        n = math.ceil(n / batch_size) * batch_size
        return n, max(8, self.prompts * self.max_new_tokens // n)


QUICK = Scale(2, 32, betas=(1.0, 0.7, 0.4), budgets=(4,), backups=("jit", "ngram", "random"))
FULL = Scale(8, 128, betas=(1.0, 0.8, 0.6, 0.4), budgets=(2, 4, 8, 16),
             backups=("jit", "ngram", "random", "auto"))  # fmt: skip
MAIN_QUICK, MAIN_FULL = (1, 32), (5, 128)  # prompts per dataset, new tokens


def results_name(stem: str, quick: bool) -> str:
    """File stem of an experiment's results: ``sweep-beta`` or ``sweep-beta-quick``."""
    return f"{stem}-quick" if quick else stem


def point(base: Config, name: str, **changes: Any) -> Config:
    """A sweep point: `base`'s server with the live settings `changes` (others at defaults)."""
    unknown = set(changes) - set(LIVE_DEFAULTS)
    if unknown:
        raise ValueError(f"not live settings: {sorted(unknown)}")
    return dataclasses.replace(base, name=name, share=base.name, admin=LIVE_DEFAULTS | changes)


def beta_points(ssd: Config, betas: Sequence[float]) -> list[Config]:
    """One point per β (Saguaro sampling; matters only at T > 0)."""
    return [point(ssd, f"SSD β={b:g}", beta=float(b)) for b in betas]


def fanout_points(ssd: Config, budgets: Sequence[int]) -> list[Config]:
    """Geometric and uniform fan-out at each budget B (equal budget per pair)."""
    return [
        point(ssd, f"SSD {shape} B={b}", fanout=shape, fanout_budget=int(b))
        for b in budgets
        for shape in ("geometric", "uniform")
    ]


def backup_points(ssd: Config, backups: Sequence[str]) -> list[Config]:
    """One point per cache-miss backup (jit, ngram, random, auto)."""
    return [point(ssd, f"SSD {backup}", backup=backup) for backup in backups]


@dataclass
class Plan:
    """One harness run: `configs` x `prompts` under `settings`, written to ``<name>.json``.

    Attributes:
        pooled: run on the `ServerPool`'s servers (kept alive across plans) instead of
            servers the harness starts and stops for this run.
        finish: adds derived keys to the finished results (rewritten to the file).
    """

    name: str
    configs: list[Config]
    prompts: list[Prompt]
    settings: RunSettings
    metadata: dict[str, Any] = field(default_factory=dict)
    pooled: bool = True
    finish: Callable[[dict[str, Any]], None] | None = None

    def batch_count(self) -> int:
        units = math.ceil(len(self.prompts) / self.settings.batch_size)
        return self.settings.repeats * units * len(self.configs)

    def estimated_s(self) -> float:
        """Measurement time at `ASSUMED_TOK_PER_S` (batching gains ignored: an upper bound)."""
        tokens = len(self.prompts) * self.settings.repeats * self.settings.sampling.max_new_tokens
        total = 0.0
        for c in self.configs:
            kind = c.algorithm if c.algorithm != "SSD" else c.ssd_mode
            total += tokens / ASSUMED_TOK_PER_S.get(kind, 2.0)
        return total


PromptSource = Callable[[str, int], list[Prompt]]


def prompt_source(tokenizer_dir: Path) -> PromptSource:
    """``(dataset, n) -> the first n chat-templated prompts`` with the target's tokenizer."""
    tokenizer = datasets.load_tokenizer(tokenizer_dir)
    return lambda dataset, n: datasets.load_prompts(dataset, tokenizer, n)


def _metadata(name: str, kind: str, dataset_names: Sequence[str], quick: bool) -> dict[str, Any]:
    return {
        "name": name,
        "experiment": kind,
        "datasets": list(dataset_names),
        "dataset_source": {d: datasets.source_info(d) for d in dataset_names},
        "quick": quick,
    }


def sweep_plans(
    kind: str, ar: Config, ssd: Config, prompts: PromptSource, *, quick: bool
) -> list[Plan]:
    """The runs of sweep `kind` (``beta``, ``fanout`` or ``backup``) around `ssd`'s server.

    Raises:
        ValueError: on an unknown kind.
    """
    scale = QUICK if quick else FULL
    data = datasets.HUMANEVAL

    def plan(stem: str, configs: list[Config], sampling: Sampling, batch: int = 1) -> Plan:
        n, tokens = scale.for_batch(batch)
        name = results_name(stem, quick)
        return Plan(
            name=name,
            configs=configs,
            prompts=prompts(data, n),
            settings=RunSettings(
                sampling=dataclasses.replace(sampling, max_new_tokens=tokens), batch_size=batch
            ),
            metadata=_metadata(name, f"sweep-{kind}", [data], quick),
        )

    if kind == "beta":
        return [plan("sweep-beta", [ar, *beta_points(ssd, scale.betas)], SAMPLED)]
    if kind == "fanout":
        return [plan("sweep-fanout", fanout_points(ssd, scale.budgets), Sampling())]
    if kind == "backup":
        configs = [ar, *backup_points(ssd, scale.backups)]
        return [plan(f"sweep-backup-b{b}", configs, Sampling(), batch=b) for b in scale.batch_sizes]
    raise ValueError(f"unknown sweep {kind!r}; known: {', '.join(SWEEPS)}")


def main_plan(configs: list[Config], prompts: PromptSource, *, quick: bool) -> Plan:
    """AR vs STANDALONE vs sync vs SSD on both prompt sets (servers started by the harness,
    since STANDALONE and sync are needed only here); adds ``ssd_comparisons``."""
    per_set, tokens = MAIN_QUICK if quick else MAIN_FULL
    name = results_name("paper-main", quick)

    def finish(results: dict[str, Any]) -> None:
        results["ssd_comparisons"] = ssd_bench.comparisons(results)

    return Plan(
        name=name,
        configs=configs,
        prompts=[p for d in datasets.DATASETS for p in prompts(d, per_set)],
        settings=RunSettings(sampling=Sampling(max_new_tokens=tokens)),
        metadata=_metadata(name, "main", datasets.DATASETS, quick),
        pooled=False,
        finish=finish,
    )


class ServerPool:
    """Servers kept alive across several runs, started (in parallel) when first asked for.

    Pass it as `run_interleaved(..., servers=pool)`. Stops every server on exit.
    """

    def __init__(self, log_dir: Path, settings: RunSettings | None = None) -> None:
        settings = settings or RunSettings()
        self.log_dir = log_dir
        self.extra_args = settings.extra_args or HARNESS_ARGS
        self.startup_timeout = settings.startup_timeout
        self.running: dict[str, tuple[Config, Server]] = {}
        self._stack = contextlib.ExitStack()

    def __call__(self, configs: Sequence[Config]) -> dict[str, Server]:
        for c in configs:
            known = self.running.get(c.server_name)
            if known is not None and not known[0].same_server(c):
                raise ValueError(f"server {c.server_name!r} is already running with other args")
        missing = {c.server_name: c for c in configs if c.server_name not in self.running}
        new = {
            key: c.server(self.log_dir, self.extra_args, startup_timeout=self.startup_timeout)
            for key, c in missing.items()
        }
        for key, server in new.items():
            self._stack.push(server)
            self.running[key] = (missing[key], server)
        with ThreadPoolExecutor(max_workers=max(1, len(new))) as pool:
            futures = [pool.submit(s.start) for s in new.values()]
        for f in futures:
            f.result()
        return {c.server_name: self.running[c.server_name][1] for c in configs}

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for _, server in self.running.values():
            server.terminate()  # all at once, then wait for each
        self._stack.close()


def done_batches(path: Path) -> int:
    """Batches an earlier run left in `path` (0 if none or unreadable)."""
    try:
        return len(read_results(path).get("batches", []))
    except (OSError, ValueError):
        return 0


def run_plans(
    plans: Sequence[Plan],
    *,
    results_dir: Path,
    log_dir: Path,
    resume: bool,
    pool: ServerPool | None = None,
) -> dict[str, dict[str, Any]]:
    """Run `plans` in order with one tqdm bar over all their batches; returns results by name.

    Pooled plans use `pool` (one is opened for the call when None). With `resume`, each plan
    keeps the batches its results file already holds (`run_interleaved(resume=True)`).
    """
    paths = {p.name: results_dir / f"{p.name}.json" for p in plans}
    total = sum(p.batch_count() for p in plans)
    initial = sum(done_batches(paths[p.name]) for p in plans) if resume else 0
    out: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        if pool is None and any(p.pooled for p in plans):
            pool = stack.enter_context(ServerPool(log_dir / "pool"))
        bar = stack.enter_context(
            tqdm(total=total, initial=min(initial, total), unit="batch", dynamic_ncols=True)
        )
        for plan in plans:
            bar.set_description(plan.name)
            results = run_interleaved(
                plan.configs,
                plan.prompts,
                plan.settings,
                log_dir=log_dir / plan.name,
                out_path=paths[plan.name],
                metadata=plan.metadata,
                progress=bar.write,
                resume=resume,
                servers=pool if plan.pooled else None,
                on_batch=lambda _: bar.update(),
            )
            if plan.finish is not None:
                plan.finish(results)
                paths[plan.name].write_text(json.dumps(results, indent=1) + "\n")
            out[plan.name] = results
    return out


def estimate_s(plans: Sequence[Plan]) -> float:
    """Rough wall time of `plans`: measurement at assumed speeds plus one startup per server."""
    servers = {c.server_name for p in plans if p.pooled for c in p.configs}
    startups = len(servers) + sum(
        len({c.server_name for c in p.configs}) for p in plans if not p.pooled
    )
    return sum(p.estimated_s() for p in plans) + ASSUMED_STARTUP_S * startups


def base_configs(
    target: Path | str, draft: Path | str, *, lookahead: int, target_cpu: int, draft_cpu: int
) -> dict[str, Config]:
    """The equal-hardware configurations of `ssd_bench` by name (AR-2c, ..., SSD-1+1c)."""
    configs = ssd_bench.bench_configs(
        target, draft, ["equal"], lookahead=lookahead, target_cpu=target_cpu, draft_cpu=draft_cpu
    )
    return {c.name: c for c in configs}


def describe(plans: Sequence[Plan]) -> Mapping[str, str]:
    """One line per plan: configurations, prompts x tokens, batch size."""
    return {
        p.name: f"{len(p.configs)} configs x {len(p.prompts)} prompts x "
        f"{p.settings.sampling.max_new_tokens} tokens, batch {p.settings.batch_size}"
        for p in plans
    }
