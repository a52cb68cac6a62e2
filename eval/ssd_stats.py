"""SSD's own counters around a measurement, and the speedup model's prediction from them.

`/ssd/stats` reports per-round averages since the server started. `totals` turns one reply into
cumulative totals, `delta` subtracts two snapshots (taken before and after a measured batch), and
`predict` feeds the measured cache hit rate, acceptance and latencies into
`sglang_ssd.saguaro.expected_speedup` (paper Theorem 7, docs/design.md#speedup-model-theorem-7) so a
benchmark can put the
model's speedup next to the measured one. `configure` changes SSD's run-time settings
(`POST /ssd/config`), which is how sweeps move between points without a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import requests

from sglang_ssd.saguaro import alpha_from_accept_length, expected_speedup

CACHE = "cache"
TIMEOUT_S = 30.0
# The speculator's cumulative counters kept as ``speculator_<name>`` for the speedup model's
# components (`eval.model_check`): outcomes and hits by fan-out F, builds by depth D, seconds by
# phase, draft forwards.
SPECULATOR_COUNTER_PREFIXES = ("fanout_outcomes_", "fanout_hits_", "builds_at_depth_", "phase_s_")
SPECULATOR_COUNTERS = ("draft_forwards", "build_draft_forwards", "drafts_received")


def fetch(url: str) -> dict[str, Any] | None:
    """`GET {url}/ssd/stats`, or None when the server has no SSD worker or does not answer."""
    try:
        reply = requests.get(f"{url}/ssd/stats", timeout=TIMEOUT_S)
    except requests.RequestException:
        return None
    return reply.json() if reply.ok else None


def configure(url: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """`POST {url}/ssd/config` with `changes`; returns the settings afterwards (the reply's
    "settings": as set, "auto" where left to the server).

    Raises:
        RuntimeError: when the server refuses the change or does not answer.
    """
    try:
        # The reply waits for the speculator's acknowledgement (a round at most when idle).
        reply = requests.post(f"{url}/ssd/config", json=dict(changes), timeout=3 * TIMEOUT_S)
    except requests.RequestException as exc:
        raise RuntimeError(f"POST /ssd/config {dict(changes)}: {exc}") from exc
    if not reply.ok:
        raise RuntimeError(
            f"POST /ssd/config {dict(changes)}: HTTP {reply.status_code} {reply.text}"
        )
    return dict(reply.json().get("settings", {}))


def totals(stats: Mapping[str, Any]) -> dict[str, float]:
    """Cumulative totals (seconds, counts) from one `/ssd/stats` reply."""
    rounds = float(stats.get("rounds", 0))
    spec = stats.get("speculator", {}) or {}
    out = {
        "rounds": rounds,
        "request_rounds": float(stats.get("request_rounds", 0)),
        "verify_s": stats.get("avg_verify_s", 0.0) * rounds,
        "wait_draft_s": stats.get("avg_wait_draft_s", 0.0) * rounds,
        "forward_s": stats.get("avg_forward_s", 0.0) * rounds,
        "speculator_steps": float(spec.get("steps", 0)),
        "speculator_build_s": float(spec.get("build_s", 0.0)),
        "speculator_backup_s": float(spec.get("backup_s", 0.0)),
        "speculator_send_s": float(spec.get("send_s", 0.0)),
    }
    for name, value in spec.items():
        if name.startswith(SPECULATOR_COUNTER_PREFIXES) or name in SPECULATOR_COUNTERS:
            out[f"speculator_{name}"] = float(value)
    for source, n in (stats.get("rounds_by_source") or {}).items():
        out[f"rounds_{source}"] = float(n)
    for source, n in (stats.get("accepted_by_source") or {}).items():
        out[f"accepted_{source}"] = float(n)
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` per key (a key missing on one side counts as 0)."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted({*before, *after})}


def add(deltas: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Sum of several deltas (the batches of one configuration)."""
    out: dict[str, float] = {}
    for d in deltas:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def measured(total: Mapping[str, float], wall_s: float) -> dict[str, float | None]:
    """Per-round quantities of the speedup model from a configuration's summed deltas.

    Args:
        total: summed `delta`s over the measured batches.
        wall_s: the batches' summed wall time, seconds.

    Returns:
        ``p_hit`` (request-rounds served from the cache), ``accept_length_hit`` /
        ``accept_length_miss`` (tokens per request-round incl. the bonus), ``round_s`` (wall time
        per round), ``target_s`` (round time minus the wait for drafts: T_v, the target's side),
        ``t_spec`` and ``t_backup`` (T_p and T_b, in units of T_v). None where a count is 0.
    """
    rounds, req_rounds = total.get("rounds", 0.0), total.get("request_rounds", 0.0)
    if rounds <= 0 or req_rounds <= 0:
        return {"rounds": rounds}
    hits = total.get(f"rounds_{CACHE}", 0.0)
    misses = req_rounds - hits
    acc_hit = total.get(f"accepted_{CACHE}", 0.0)
    acc_all = sum(v for k, v in total.items() if k.startswith("accepted_"))
    round_s = wall_s / rounds
    target_s = round_s - total.get("wait_draft_s", 0.0) / rounds
    steps = total.get("speculator_steps", 0.0)
    # A round waits for the backup only when one of its requests missed; at batch 1 (the
    # benchmark's case) those are the miss request-rounds.
    miss_rounds = min(misses, rounds)
    return {
        "rounds": rounds,
        "p_hit": hits / req_rounds,
        "accept_length": 1 + acc_all / req_rounds,
        "accept_length_hit": 1 + acc_hit / hits if hits else None,
        "accept_length_miss": 1 + (acc_all - acc_hit) / misses if misses else None,
        "round_s": round_s,
        "target_s": target_s,
        "verify_s": total.get("verify_s", 0.0) / rounds,
        "wait_draft_s": total.get("wait_draft_s", 0.0) / rounds,
        "t_spec": (total.get("speculator_build_s", 0.0) / steps / target_s) if steps else None,
        "t_backup": (
            total.get("speculator_backup_s", 0.0) / miss_rounds / target_s if miss_rounds else 0.0
        ),
    }


def predict(
    m: Mapping[str, float | None],
    lookahead: int,
    batch_size: int,
    ar_tok_per_s: float,
    async_mode: bool = True,
) -> float | None:
    """The speedup over AR that the model predicts from measured quantities (`measured`).

    Args:
        m: output of `measured`.
        lookahead: γ (α is solved from the accept lengths with this lookahead).
        batch_size: b; the batch waits for its slowest request.
        ar_tok_per_s: the AR configuration's measured throughput on the same hardware, used for
            T_AR / T_v (one AR step emits ``batch_size`` tokens).
        async_mode: False for `--ssd-mode sync`, where the speculator builds nothing (T_p = 0)
            and every round is a miss served by the just-in-time draft.

    Returns:
        Predicted speedup over AR, or None when a needed quantity was not measured.

    Source: paper Theorem 7 via `sglang_ssd.saguaro.expected_speedup`
    (docs/design.md#speedup-model-theorem-7).
    """
    needed = ("p_hit", "target_s", "accept_length")
    if any(m.get(k) is None for k in needed) or ar_tok_per_s <= 0:
        return None
    l_hit = m.get("accept_length_hit") or m["accept_length"]
    l_miss = m.get("accept_length_miss") or m["accept_length"]
    target_s = float(m["target_s"])  # type: ignore[arg-type]
    t_ar = batch_size / ar_tok_per_s
    return expected_speedup(
        alpha_hit=alpha_from_accept_length(min(float(l_hit), lookahead + 1.0), lookahead),
        alpha_miss=alpha_from_accept_length(min(float(l_miss), lookahead + 1.0), lookahead),
        lookahead=lookahead,
        p_hit=float(m["p_hit"]),  # type: ignore[arg-type]
        t_spec=float(m.get("t_spec") or 0.0) if async_mode else 0.0,
        t_backup=float(m.get("t_backup") or 0.0),
        batch_size=batch_size,
        t_ar_over_t_verify=t_ar / target_s,
    )
