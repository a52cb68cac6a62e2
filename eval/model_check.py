"""The speedup model against a run it did not see.

`components` reads, from one run's results (`eval ssd` / `eval run`), what the model needs at
that run's batch size b, every one a component measurement of SSD's own counters (summed
`eval.ssd_stats.delta`s) or of the AR configuration; nothing is fitted to end-to-end tok/s:

- T_v: the target's round without the wait for drafts, seconds (`ssd_stats.measured`'s
  ``target_s``); T_AR = b / (AR tok/s), one AR step of the batch.
- the build: t_forward, the seconds per draft forward ((glue + tree bodies) / build forwards +
  (LM head + sampling) / all forwards, as `sglang_ssd.saguaro.self_tuning` counts them), and
  t_fixed, the rest of a build: T_p(D) = t_fixed + (1 + D) t_forward, which grows with b
  because both were measured at b.
- α: per-token acceptance of cache hits, solved from their accept length at the run's depth.
- the hit model 1 - p_hit(F) = c F^-r (paper Definition 11), fitted by `fit_hit_model` to the
  outcomes observed at each fan-out F, and the coverage: the share of request-rounds that had
  branches at all (a request's first round never does).
- the backup: accept length on a miss and its latency T_b (seconds per miss round).

`predict` then rates another fan-out budget B' and depth D' at the same b:

    F = geometric_fanout(B', D', α, r)          (Theorem 12, as the speculator plans it)
    h(D) = Σ_k π_k(α, D) (1 - c F_k^-r)         π_k: k of a D-token draft accepted
    p_hit = coverage · h_m / (1 - h_h + h_m)    stationary: after a hit the tree hangs off a
                                                D'-token draft (h_h), after a miss off the
                                                γ-token backup (h_m, with α_miss)
    speedup = expected_speedup(α, α_miss, γ, p_hit, T_p(D')/T_v, T_b/T_v, b, T_AR/T_v, D')

A self-tuned D' is the depth the model rates fastest (what `DepthTuner` aims at). What the
model leaves out: the verify's width (D' + 1 rows per request) and a tree's width (B' branches
per forward) change T_v and t_forward a little on a CPU; both are taken as measured.

`python -m eval model --components C.json --target T.json` predicts every async SSD row of T
(sync rows are skipped) from C's components at the same batch size and temperature, and prints
the predicted speedup over AR against T's measured one (each run against its own AR), and the
predicted tok/s (speedup × C's AR) against T's measured tok/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eval import ssd_stats
from eval.configs import Config
from sglang_ssd.config import SSDConfig
from sglang_ssd.launch_server import flag_value
from sglang_ssd.saguaro import (
    alpha_from_accept_length,
    expected_speedup,
    fit_hit_counts,
    geometric_fanout,
)
from sglang_ssd.saguaro.fanout import hit_rate
from sglang_ssd.saguaro.self_tuning import forward_seconds
from sglang_ssd.speculator.fanout_plan import DEFAULT_HIT_EXPONENT, MIN_OBSERVATIONS_PER_FANOUT

SPEC = "speculator_"
# Geometric fan-out's cap on F_k (V - 1); far above any budget used here.
VOCAB_CAP = 1 << 16
AIM = 0.10  # the model's allowed error, |predicted / measured - 1|
SSD_DEFAULTS = SSDConfig()


@dataclass(frozen=True)
class Components:
    """What one run measured at batch `batch_size` (module docstring); seconds, rates in [0, 1].

    Attributes:
        batch_size: b. lookahead: γ. depth: D of the run's builds (the most frequent).
        budget: B of the run. t_verify, t_ar: T_v and T_AR, seconds.
        t_forward, t_fixed: a build's seconds per draft forward and outside its forwards.
        alpha, alpha_miss: per-token acceptance of hits and of backup drafts.
        hit_c, hit_r: the hit model's c and r. coverage: request-rounds with branches.
        t_backup: backup latency per miss round, seconds. p_hit: the run's measured hit rate.
        temperature: the run's sampling temperature (0: greedy); α depends on it.
    """

    batch_size: int
    lookahead: int
    depth: int
    budget: int
    t_verify: float
    t_ar: float
    t_forward: float
    t_fixed: float
    alpha: float
    alpha_miss: float
    hit_c: float
    hit_r: float
    coverage: float
    t_backup: float
    p_hit: float
    temperature: float = 0.0

    def build_time(self, depth: int) -> float:
        """T_p(D) = t_fixed + (1 + D) t_forward, seconds."""
        return self.t_fixed + (1 + depth) * self.t_forward

    def hit_after(self, alpha: float, draft_depth: int, fanout: Sequence[int]) -> float:
        """Σ_k π_k (1 - c F_k^-r): the chance that the outcome of a `draft_depth`-token draft
        accepted per token with `alpha` finds its branch, given F_0..F_depth."""
        total = 0.0
        for k, f in enumerate(fanout):
            p_k = alpha**k * (1.0 - alpha) if k < draft_depth else alpha**draft_depth
            total += p_k * hit_rate(f, self.hit_c, self.hit_r)
        return total

    def p_hit_at(self, budget: int, depth: int) -> float:
        """The modelled hit rate at B = `budget`, D = `depth` (module docstring)."""
        after_hit = self.hit_after(
            self.alpha, depth, geometric_fanout(budget, depth, self.alpha, self.hit_r, VOCAB_CAP)
        )
        gamma = self.lookahead
        after_miss = self.hit_after(
            self.alpha_miss,
            gamma,
            geometric_fanout(budget, gamma, self.alpha, self.hit_r, VOCAB_CAP),
        )
        stationary = after_miss / (1.0 - after_hit + after_miss) if after_miss > 0 else 0.0
        return self.coverage * stationary


def components(results: Mapping[str, Any], ssd: str, ar: str = "AR-2c") -> Components:
    """The model's components from configuration `ssd` of `results`, with `ar` for T_AR.

    Raises:
        ValueError: when `ssd` or `ar` is missing, or `ssd`'s batches lack the counters the
            model needs (an SSD server older than these counters, or no build at all).
    """
    summary = results.get("summary", {}).get("configs", {})
    if ssd not in summary or ar not in summary:
        raise ValueError(f"{ssd!r} and {ar!r} must both be in the results")
    batches = [b for b in results["batches"] if b["config"] == ssd]
    total = ssd_stats.add(b["ssd"] for b in batches if b.get("ssd"))
    wall = sum(b["wall_s"] for b in batches)
    m = ssd_stats.measured(total, wall)
    batch = int(results["settings"]["batch_size"])
    config = Config.from_dict(next(c for c in results["configs"] if c["name"] == ssd))
    gamma = config.lookahead or SSD_DEFAULTS.lookahead
    builds = _by_int(total, f"{SPEC}builds_at_depth_")
    outcomes = _by_int(total, f"{SPEC}fanout_outcomes_")
    hits = _by_int(total, f"{SPEC}fanout_hits_")
    forwards = total.get(f"{SPEC}draft_forwards", 0.0)
    build_forwards = total.get(f"{SPEC}build_draft_forwards", 0.0)
    steps = total.get("speculator_steps", 0.0)
    if not builds or not outcomes or build_forwards <= 0 or steps <= 0 or m.get("p_hit") is None:
        raise ValueError(
            f"{ssd!r} has no build counters in its batches: use a run made with the "
            "speculator's fan-out and build counters (`SpeculatorStats.fanout_outcomes`)"
        )
    depth = max(builds, key=lambda d: builds[d])
    phase = {k[len(f"{SPEC}phase_s_") :]: v for k, v in total.items() if "phase_s_" in k}
    t_forward = forward_seconds(phase, max(forwards, build_forwards), build_forwards)
    t_build = total["speculator_build_s"] / steps
    c, r = _fit(outcomes, hits)
    l_hit = m.get("accept_length_hit") or m["accept_length"]
    l_miss = m.get("accept_length_miss") or m["accept_length"]
    target_s = float(m["target_s"])
    return Components(
        batch_size=batch,
        lookahead=gamma,
        depth=depth,
        budget=_budget(config),
        t_verify=target_s,
        t_ar=batch / summary[ar]["tok_per_s"],
        t_forward=t_forward,
        t_fixed=max(t_build - (1 + depth) * t_forward, 0.0),
        alpha=alpha_from_accept_length(min(float(l_hit), depth + 1.0), depth),
        alpha_miss=alpha_from_accept_length(min(float(l_miss), gamma + 1.0), gamma),
        hit_c=c,
        hit_r=r,
        coverage=min(sum(outcomes.values()) / total["request_rounds"], 1.0),
        t_backup=float(m.get("t_backup") or 0.0) * target_s,
        p_hit=float(m["p_hit"]),
        temperature=_temperature(results),
    )


def predict(comp: Components, budget: int, depth: int | None = None) -> dict[str, Any]:
    """Modelled speedup over AR at fan-out budget `budget` and tree depth `depth` (None:
    self-tuned, the D in 1..γ the model rates fastest) at the components' batch size.

    Returns:
        ``speedup``, ``depth`` (the D rated), ``p_hit``, ``t_spec`` (T_p / T_v) and the
        speedup at every D (``by_depth``).

    Source: paper Theorem 7 with docs/design.md#speedup-model-theorem-7 corrections
    (`expected_speedup`), Definition 11
    and Theorem 12 for the hit rate.
    """
    by_depth = {d: _speedup(comp, budget, d) for d in range(1, comp.lookahead + 1)}
    chosen = depth if depth is not None else max(by_depth, key=lambda d: (by_depth[d][0], d))
    speed, p_hit, t_spec = by_depth.get(chosen) or _speedup(comp, budget, chosen)
    return {
        "budget": budget,
        "depth": chosen,
        "self_tuned": depth is None,
        "speedup": speed,
        "p_hit": p_hit,
        "t_spec": t_spec,
        "by_depth": {str(d): v[0] for d, v in by_depth.items()},
    }


def _speedup(comp: Components, budget: int, depth: int) -> tuple[float, float, float]:
    p_hit = comp.p_hit_at(budget, depth)
    t_spec = comp.build_time(depth) / comp.t_verify
    speed = expected_speedup(
        alpha_hit=comp.alpha,
        alpha_miss=comp.alpha_miss,
        lookahead=comp.lookahead,
        hit_lookahead=depth,
        p_hit=p_hit,
        t_spec=t_spec,
        t_backup=comp.t_backup / comp.t_verify,
        batch_size=comp.batch_size,
        t_ar_over_t_verify=comp.t_ar / comp.t_verify,
    )
    return speed, p_hit, t_spec


def check(comp: Components, target: Mapping[str, Any], ar: str = "AR-2c") -> list[dict[str, Any]]:
    """Each async SSD configuration of `target` (same batch size and temperature as `comp`):
    its B and D (from its flags; D None when self-tuned), the prediction, the measured speedup
    over `target`'s own `ar` and the error predicted / measured - 1 (``within``: |error| <=
    `AIM`); also the predicted tok/s (speedup × the components' AR, ``predicted_tok_per_s``)
    against the measured one (``tok_per_s_error``), which carries the drift between the runs.

    Raises:
        ValueError: when the batch sizes or temperatures differ, or `ar` is missing from
            `target`.
    """
    if int(target["settings"]["batch_size"]) != comp.batch_size:
        raise ValueError(
            f"components at batch {comp.batch_size}, target run at "
            f"{target['settings']['batch_size']}: the model needs components at the same b"
        )
    if _temperature(target) != comp.temperature:
        raise ValueError(
            f"components at T = {comp.temperature}, target run at T = {_temperature(target)}: "
            "acceptance depends on the temperature"
        )
    summary = target["summary"]["configs"]
    if ar not in summary:
        raise ValueError(f"{ar!r} is not in the target run")
    rows = []
    for config in map(Config.from_dict, target["configs"]):
        if config.algorithm != "SSD" or config.ssd_mode != "async":
            continue
        name = config.name
        measured = summary[name]["tok_per_s"] / summary[ar]["tok_per_s"]
        row = predict(comp, _budget(config), _depth(config))
        error = row["speedup"] / measured - 1
        row.update(config=name, measured=measured, error=error, within=abs(error) <= AIM)
        tok_s = row["speedup"] * comp.batch_size / comp.t_ar
        row.update(
            predicted_tok_per_s=tok_s,
            measured_tok_per_s=summary[name]["tok_per_s"],
            tok_per_s_error=tok_s / summary[name]["tok_per_s"] - 1,
        )
        rows.append(row)
    return rows


def report(comp: Components, rows: Sequence[Mapping[str, Any]]) -> str:
    """Plain text: the components (seconds), then predicted vs measured per row."""
    lines = [
        f"components at b={comp.batch_size}, T={comp.temperature}, B={comp.budget}, "
        f"D={comp.depth}: T_v (target round) {comp.t_verify:.3f} s, T_AR {comp.t_ar:.3f} s, "
        f"t_forward {comp.t_forward:.3f} s, t_fixed {comp.t_fixed:.3f} s, "
        f"T_b {comp.t_backup:.3f} s, alpha {comp.alpha:.3f}, alpha_miss {comp.alpha_miss:.3f}, "
        f"hit model c={comp.hit_c:.3f} r={comp.hit_r:.3f}, coverage {comp.coverage:.3f}",
        f"T_p(D={comp.depth}) = {comp.build_time(comp.depth) / comp.t_verify:.2f} T_v; "
        f"modelled p_hit there {comp.p_hit_at(comp.budget, comp.depth):.3f} "
        f"(measured {comp.p_hit:.3f})",
    ]
    for r in rows:
        d = f"D self-tuned (model picks D={r['depth']})" if r["self_tuned"] else f"D={r['depth']}"
        lines.append(
            f"{r['config']}: B={r['budget']}, {d}: predicted {r['speedup']:.2f}× its AR, "
            f"measured {r['measured']:.2f}×, error {100 * r['error']:+.1f}% "
            f"({'within' if r['within'] else 'outside'} {100 * AIM:.0f}%); predicted "
            f"{r['predicted_tok_per_s']:.2f} tok/s, measured {r['measured_tok_per_s']:.2f} "
            f"({100 * r['tok_per_s_error']:+.1f}%)"
        )
    return "\n".join(lines)


def _temperature(results: Mapping[str, Any]) -> float:
    return float(results["settings"].get("sampling", {}).get("temperature", 0.0))


def _by_int(total: Mapping[str, float], prefix: str) -> dict[int, float]:
    return {int(k[len(prefix) :]): v for k, v in total.items() if k.startswith(prefix) and v > 0}


def _fit(outcomes: Mapping[int, float], hits: Mapping[int, float]) -> tuple[float, float]:
    """c and r from outcomes / hits by F (`fit_hit_counts`, with the speculator's minimum per F);
    one usable F only: r from `fanout_plan`'s default, c from that F's rate."""
    fitted = fit_hit_counts(outcomes, hits, MIN_OBSERVATIONS_PER_FANOUT)
    if fitted is not None:
        return fitted
    usable = {f: n for f, n in outcomes.items() if f >= 1 and n >= MIN_OBSERVATIONS_PER_FANOUT}
    if not usable:
        raise ValueError("no fan-out value has enough outcomes to fit the hit model")
    ((f, n),) = usable.items()
    miss = (n - hits.get(f, 0.0) + 0.5) / (n + 1)  # half a pseudo-miss, as `fit_hit_counts`
    return miss * f**DEFAULT_HIT_EXPONENT, DEFAULT_HIT_EXPONENT


def _budget(config: Config) -> int:
    """B of a configuration: its admin setting, else its flag, else `SSDConfig`'s default."""
    value = (config.admin or {}).get("fanout_budget")
    if value is None:
        value = flag_value(config.args, "--ssd-fanout-budget")
    return int(value) if value is not None else SSD_DEFAULTS.fanout_budget


def _depth(config: Config) -> int | None:
    """D of a configuration, None when self-tuned (no value, or 0)."""
    value = (config.admin or {}).get("tree_depth")
    if value is None:
        value = flag_value(config.args, "--ssd-tree-depth")
    return int(value) or None if value is not None else None
