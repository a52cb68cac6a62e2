"""Samples of the sharp tiny pair's first tokens from live servers: AR, and SSD under three
settings switched live on one server.

The AR and SSD servers may be resident together (`draw_together`): an idle SGLang CPU scheduler
sleeps (SGLang's `--sleep-on-idle`, which the launcher sets on CPU: ~1.5% of a core each,
measured with `top` on a 2-core EPYC), and the draws time nothing. Every request is a batched
`/generate` (`input_ids`, the prompts interleaved, T = `TEMPERATURE`, default top-k/top-p,
`ignore_eos`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from eval.distribution.tiny_pair import PROMPTS, TEMPERATURE
from eval.servers import Server, started_together
from sglang_ssd.config import CYCLE_ENV

LOOKAHEAD = 2
# Token 1 comes from the prefill sampler, tokens 2-4 from one or two SSD rounds (γ = 2).
NEW_TOKENS = LOOKAHEAD + 2
REQUESTS_PER_POST = 512
STARTUP_TIMEOUT_S = 900.0
# SSD settings sampled on one server, changed live through `POST /ssd/config` (or, without the
# admin endpoint, one server each). "auto" picks the n-gram backup at these batch sizes. β < 1
# runs with the predicted fan-out, whose per-request allocation sets which tokens σ down-weights.
SSD_CONFIGS: dict[str, dict[str, Any]] = {
    "ssd": {"beta": 1.0, "backup": "auto"},
    "ssd_jit": {"beta": 1.0, "backup": "jit"},
    "ssd_beta_0.5": {"beta": 0.5, "backup": "jit", "fanout": "predicted"},
}
CONFIGS = ["ar", *SSD_CONFIGS]


@dataclass
class Draws:
    """What one configuration produced.

    Attributes:
        samples: per prompt, the sampled continuations (`NEW_TOKENS` token ids each).
        metas: every response's `meta_info`.
        seconds: wall time of the sampling requests (server start-up not included).
    """

    samples: list[list[tuple[int, ...]]]
    metas: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Verify rounds, accepted-draft histogram (k = 0..γ), accept length (bonus included),
        cache hit rate and backup rounds by kind (the last two from SSD's `meta_info`)."""
        rounds = sum(m.get("spec_verify_ct", 0) for m in self.metas)
        hist = np.zeros(LOOKAHEAD + 1, dtype=np.int64)
        for m in self.metas:
            h = m.get("spec_correct_drafts_histogram") or []
            hist[: len(h)] += np.asarray(h[: LOOKAHEAD + 1], dtype=np.int64)
        out: dict[str, Any] = {
            "requests": len(self.metas),
            "rounds": rounds,
            "seconds": round(self.seconds, 1),
        }
        if hist.sum():
            out["accept_hist"] = hist.tolist()
            out["accept_length"] = round(1 + float(np.arange(LOOKAHEAD + 1) @ hist / hist.sum()), 3)
        ssd_rounds = sum(m.get("ssd_rounds", 0) for m in self.metas)
        if ssd_rounds:
            hits = sum(m["ssd_cache_hit_rate"] * m["ssd_rounds"] for m in self.metas)
            out["cache_hit_rate"] = round(hits / ssd_rounds, 3)
            backups: dict[str, int] = {}
            for m in self.metas:
                for kind, count in (m.get("ssd_backup_rounds") or {}).items():
                    if count:
                        backups[kind] = backups.get(kind, 0) + count
            out["backup_rounds"] = backups
        return out


def _server(
    name: str, target_dir: Path, logs: Path, *extra: str, env: dict[str, str] | None = None
) -> Server:
    args = [
        "--model-path", str(target_dir),
        "--dtype", "float32",
        "--max-total-tokens", "4096",
        "--random-seed", "0",
        *extra,
    ]  # fmt: skip
    log = logs / f"{name}.log"
    return Server(name, args, log_path=log, startup_timeout=STARTUP_TIMEOUT_S, env=env or {})


def ar_server(target_dir: Path, logs: Path) -> Server:
    """The autoregressive server of the target (not started)."""
    return _server("ar", target_dir, logs, "--speculative-algorithm", "NONE")


def ssd_server(name: str, target_dir: Path, draft_dir: Path, logs: Path, *extra: str) -> Server:
    """An SSD server of the pair with γ = `LOOKAHEAD` (not started); `extra`: more flags. Its
    `--ssd-mode auto` switches arrangement every round (async, sync and plain in turn:
    `config.CYCLE_ENV`), so the draws cover every arrangement and the switches."""
    return _server(
        name,
        target_dir,
        logs,
        "--speculative-algorithm", "SSD",
        "--speculative-draft-model-path", str(draft_dir),
        "--speculative-num-steps", str(LOOKAHEAD),
        "--ssd-mode", "auto",
        *extra,
        env={CYCLE_ENV: "1"},
    )  # fmt: skip


def draw(server: Server, samples_per_prompt: int) -> Draws:
    """`samples_per_prompt` continuations of each prompt, the prompts interleaved in batches.

    Raises AssertionError on a non-200 answer or an output of the wrong length.
    """
    draws = Draws(samples=[[] for _ in PROMPTS])
    per_prompt = REQUESTS_PER_POST // len(PROMPTS)
    start = time.perf_counter()
    for first in range(0, samples_per_prompt, per_prompt):
        count = min(per_prompt, samples_per_prompt - first)
        ids = [list(PROMPTS[i % len(PROMPTS)]) for i in range(count * len(PROMPTS))]
        body = {
            "input_ids": ids,
            "sampling_params": {
                "temperature": TEMPERATURE,
                "max_new_tokens": NEW_TOKENS,
                "ignore_eos": True,
            },
        }
        response = requests.post(f"{server.url}/generate", json=body, timeout=600)
        assert response.status_code == 200, response.text[:2000]
        for i, out in enumerate(response.json()):
            assert len(out["output_ids"]) == NEW_TOKENS, out
            draws.samples[i % len(PROMPTS)].append(tuple(out["output_ids"]))
            draws.metas.append(out["meta_info"])
    draws.seconds = time.perf_counter() - start
    return draws


def configure(server: Server, settings: dict[str, Any]) -> bool:
    """Apply SSD settings live (`POST /ssd/config`); False if the server has no such endpoint.

    Raises AssertionError if the server refuses them or does not report them back.
    """
    response = requests.post(f"{server.url}/ssd/config", json=settings, timeout=120)
    if response.status_code in (404, 405):
        return False
    assert response.status_code == 200, response.text
    current = requests.get(f"{server.url}/ssd/config", timeout=60).json()["settings"]
    assert {k: current[k] for k in settings} == settings, current
    return True


def draw_ar(target_dir: Path, logs: Path, samples_per_prompt: int) -> Draws:
    """Start the AR server, draw, stop it."""
    with ar_server(target_dir, logs) as server:
        return draw(server, samples_per_prompt)


def draw_ssd(
    target_dir: Path,
    draft_dir: Path,
    logs: Path,
    samples_per_prompt: int,
    done: Callable[[str, Draws], None] = lambda name, draws: None,
    names: Collection[str] = tuple(SSD_CONFIGS),
) -> dict[str, Draws]:
    """Draws of the `SSD_CONFIGS` settings in `names`: one server switched live (one server per
    setting if it has no admin endpoint); `done` is called after each setting."""
    wanted = {name: settings for name, settings in SSD_CONFIGS.items() if name in names}
    with ssd_server("ssd", target_dir, draft_dir, logs) as server:
        out = draw_live(server, samples_per_prompt, done, wanted)
    for name, settings in wanted.items():
        if name not in out:
            flags = ["--ssd-beta", str(settings["beta"]), "--ssd-backup", settings["backup"]]
            flags += ["--ssd-fanout", settings.get("fanout", "geometric")]
            with ssd_server(name, target_dir, draft_dir, logs, *flags) as server:
                out[name] = draw(server, samples_per_prompt)
            done(name, out[name])
    return out


def draw_live(
    server: Server,
    samples_per_prompt: int,
    done: Callable[[str, Draws], None] = lambda name, draws: None,
    wanted: dict[str, dict[str, Any]] = SSD_CONFIGS,
) -> dict[str, Draws]:
    """Draws of each of `wanted`'s settings on the running SSD `server`, each switched live;
    stops at the first setting the server cannot take live (no admin endpoint), so the result
    may miss some; `done` is called after each setting.

    Raises AssertionError when the server refuses a setting or answers a draw with an error.
    """
    out: dict[str, Draws] = {}
    for name, settings in wanted.items():
        if not configure(server, settings):
            break
        out[name] = draw(server, samples_per_prompt)
        done(name, out[name])
    return out


def draw_together(
    target_dir: Path, draft_dir: Path, logs: Path, samples_per_prompt: int
) -> dict[str, Draws]:
    """Draws of every configuration (`CONFIGS`): the AR and the SSD server started side by side
    (their start-ups overlap), then AR's draws, then each SSD setting switched live.

    Raises:
        eval.servers.ServerError: if a server fails to start.
        AssertionError: if the SSD server cannot take the settings live, or a draw fails.
    """
    ssd = ssd_server("ssd", target_dir, draft_dir, logs)
    made = {"ar": ar_server(target_dir, logs), "ssd": ssd}
    with started_together(made):
        out = {"ar": draw(made["ar"], samples_per_prompt)}
        out |= draw_live(made["ssd"], samples_per_prompt)
    assert set(out) == set(CONFIGS), f"drew only {sorted(out)}"
    return out
