"""The speculator engine on CUDA and whole SSD rounds (engine + verify, no SGLang) vs the CPU.

A tiny random Qwen2 pair is built on the fly (`ssd_round.make_pair`). Checks: the engine opens a
request, builds a tree, serves a hit, and the hit's tree-decoded draft equals a fresh per-branch
(just-in-time) decode of the same prefix; whole rounds emit the CPU's tokens on greedy rows
(float32), and at T > 0 CUDA's verify of each round equals the CPU's verify of the same drafts
and q given the same CPU-drawn uniforms. The draft's own sampling at T > 0 uses a generator on
the draft's device (`speculator.state.generator_device`), so CPU and CUDA drafts differ there by
design; what must agree is the verify of a given draft. Host syncs of a hit-path round are
counted as on the CPU (`sglang_ssd.host_syncs.HostSyncCounter`, held to the same
`SPECULATOR_ROUND_BUDGET` as tests/test_host_syncs.py) and, by CUDA's own count
(`torch.cuda.set_sync_debug_mode`, blocking host-to-device copies included), reported.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from ssd_round import LOOKAHEAD, PROMPTS, Round, engine_on, make_pair, target_logits, target_on

from sglang_ssd.host_syncs import SPECULATOR_ROUND_BUDGET, HostSyncCounter
from sglang_ssd.saguaro import VerifyUniforms, apply_sampling, verify
from sglang_ssd.speculator.engine import OutcomeIn

pytestmark = pytest.mark.gpu

ROUNDS = 6
MARGIN_EPS = 1e-4  # greedy: a top-2 logit margin below this (fp32) may flip between devices
TIE_EPS = 1e-5  # sampled: |u - min(1, p/q)| below this may flip between devices


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("pair"))


@pytest.mark.parametrize("use_k", [0, 2, LOOKAHEAD])
def test_engine_serves_a_hit_equal_to_per_branch_decode(
    cuda: torch.device, pair: tuple[Path, Path], use_k: int, record_property
) -> None:
    draft_path, _ = pair
    engine = engine_on(draft_path, cuda, fanout="uniform")
    prompt = PROMPTS[0]
    engine.open("r", prompt, temperature=0.0, top_k=1, top_p=1.0)
    (draft,) = engine.serve(["r"], backup="jit", depth=LOOKAHEAD)
    assert draft is not None and draft.source == "jit"
    engine.build(["r"])
    state = engine.requests["r"]
    assert state.branches is not None and state.branches.slots.device.type == cuda.type
    rows = [i for i, k in enumerate(state.branches.ks) if k == use_k]
    assert rows, f"uniform fan-out must fork at k={use_k}"
    bonus = state.branches.bonus[rows[0]]
    committed = prompt + draft.tokens[:use_k] + [bonus]
    engine.apply_outcomes([OutcomeIn("r", use_k, bonus)])
    hit = engine.requests["r"].draft
    assert hit is not None and hit.source == "cache", "the cached branch was not served"

    fresh = engine_on(draft_path, cuda)
    fresh.open("r", committed[:-1], temperature=0.0, top_k=1, top_p=1.0)
    fresh.apply_outcomes([OutcomeIn("r", 0, committed[-1])])
    (expected,) = fresh.serve(["r"], backup="jit", depth=LOOKAHEAD)
    assert hit.tokens == expected.tokens, "tree decode differs from per-branch decode"
    record_property("detail", f"k={use_k}: hit {hit.tokens} == per-branch decode")


def test_greedy_rounds_equal_cpu(cuda: torch.device, pair: tuple[Path, Path], record_property):
    draft_path, target_path = pair
    runs = []
    for device in (torch.device("cpu"), cuda):
        run = Round(engine_on(draft_path, device), target_on(target_path, device), [0.0, 0.0])
        run.open()
        gen = torch.Generator().manual_seed(0)
        for _ in range(ROUNDS):
            run.step(gen)
        runs.append(run)
    cpu, on_cuda = runs
    target = target_on(target_path, "cpu")
    allowed = []
    for rid, prompt in zip(cpu.rids, PROMPTS, strict=False):
        a, b = cpu.emitted[rid], on_cuda.emitted[rid]
        n = min(len(a), len(b))
        first = next((i for i in range(n) if a[i] != b[i]), None)
        if first is None:
            continue
        margin = _top2_margin(target, prompt + a[:first])
        assert margin < MARGIN_EPS, (
            f"{rid}: token {first} differs CPU {a[first]} vs CUDA {b[first]} at fp32 top-2 "
            f"margin {margin:.2e} >= {MARGIN_EPS}"
        )
        allowed.append((rid, first, margin))
    hits = sum(s == "cache" for srcs in on_cuda.sources for s in srcs)
    total = sum(len(srcs) for srcs in on_cuda.sources)
    lengths = {r: len(t) for r, t in on_cuda.emitted.items()}
    record_property(
        "detail",
        f"{ROUNDS} rounds, tokens {lengths}, CUDA hits {hits}/{total}, near-ties {allowed}",
    )


def test_sampled_rounds_verify_like_cpu(
    cuda: torch.device, pair: tuple[Path, Path], record_property
) -> None:
    draft_path, target_path = pair
    run = Round(engine_on(draft_path, cuda), target_on(target_path, cuda), [0.0, 0.8, 1.0])
    run.open()
    gen = torch.Generator().manual_seed(1)
    for _ in range(ROUNDS):
        run.step(gen)
    cpu_target = target_on(target_path, "cpu")
    sampling = run.sampling
    ties, compared = [], 0
    for n, rec in enumerate(run.records):
        depth = rec.tokens.shape[1]
        logits = torch.cat([target_logits(cpu_target, seq, depth) for seq in rec.sequences])
        cpu = verify(logits, rec.tokens, rec.q, sampling, rec.point_mass, uniforms=rec.uniforms)
        p = apply_sampling(logits, sampling)
        for i in range(len(rec.sequences)):
            compared += 1
            ka, kb = int(cpu.accept_len[i]), int(rec.result.accept_len[i])
            same = ka == kb and int(cpu.bonus_token[i]) == int(rec.result.bonus_token[i])
            if same:
                continue
            tie = _near_tie(p[i], rec.q[i], rec.tokens[i], rec.uniforms, i, min(ka, kb), ka == kb)
            assert tie is not None, (
                f"round {n} row {i}: CPU ({ka}, {int(cpu.bonus_token[i])}) vs CUDA "
                f"({kb}, {int(rec.result.bonus_token[i])}) with no near-tie"
            )
            ties.append((n, i, tie))
    record_property("detail", f"{compared} request-rounds equal CPU's verify; near-ties {ties}")


def test_host_syncs_per_hit_round(cuda: torch.device, pair: tuple[Path, Path], record_property):
    """A hit-path round (apply the outcome that hits, serve, build) as served on CUDA (the KV
    pool's debug checks off) makes at most `SPECULATOR_ROUND_BUDGET` counted syncs, as on the
    CPU; CUDA's own count of synchronising calls by phase is reported."""
    draft_path, target_path = pair
    run = Round(engine_on(draft_path, cuda), target_on(target_path, cuda), [0.0, 0.8])
    run.engine.model.kv_pool.debug = False  # serving's default on CUDA (`kv_pool.default_debug`)
    counter = HostSyncCounter()
    run.engine.model.phases.sync = counter.device_sync  # still `torch.cuda.synchronize`
    run.open()
    gen = torch.Generator().manual_seed(2)
    run.step(gen)  # warm-up
    counts: dict[str, list[int]] = {"apply": [], "serve": [], "build": []}
    counted = []
    for _ in range(3):
        outcomes = [_hitting_outcome(run, rid) for rid in run.rids]
        counter.reset()
        for name, call in (
            ("apply", lambda o=outcomes: run.engine.apply_outcomes(o)),
            ("serve", lambda: run.engine.serve(run.rids, backup="jit", depth=LOOKAHEAD)),
            ("build", lambda: run.engine.build(run.rids)),
        ):
            with counter:
                counts[name].append(_syncs(call))
        counted.append(counter.total)
    sources = [run.engine.requests[r].draft.source for r in run.rids]
    per_round = sum(counts[name][-1] for name in counts)
    record_property(
        "detail",
        f"counted syncs/round {counted} (budget {SPECULATOR_ROUND_BUDGET}); CUDA's count by "
        f"phase {counts}, {per_round}/round",
    )
    assert sources and all(s in ("cache", "jit") for s in sources)
    assert max(counted) <= SPECULATOR_ROUND_BUDGET, counter.report()


def _hitting_outcome(run: Round, rid: str) -> OutcomeIn:
    """An outcome (k, bonus) whose branch the cache holds (the first pre-speculated one)."""
    branches = run.engine.requests[rid].branches
    assert branches is not None, f"{rid} has no branches to hit"
    return OutcomeIn(rid, branches.ks[0], branches.bonus[0])


def _syncs(call) -> int:
    """Host-device synchronisations during `call()`, by torch's sync debug mode warnings."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def _top2_margin(target: torch.nn.Module, sequence: list[int]) -> float:
    """The target's fp32 top-2 logit margin at the next token after `sequence` (CPU)."""
    logits = target_logits(target, sequence, 0)[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def _near_tie(
    p: torch.Tensor,
    q: torch.Tensor,
    tokens: torch.Tensor,
    uniforms: VerifyUniforms,
    row: int,
    k: int,
    same_k: bool,
) -> str | None:
    """Why CPU and CUDA may disagree on `row`, or None. Different accept lengths: draft token k
    (the first disagreement) must sit at |u - min(1, p/q)| < TIE_EPS. Same k, different bonus:
    the bonus uniform must lie within TIE_EPS of a boundary of the normalised residual CDF
    (max(p - q, 0) at a rejection, p after all D). p [D + 1, V] and q [D, V] are the CPU's (q
    zero on point-mass rows)."""
    depth = tokens.shape[0]
    point_mass = depth == 0 or float(q.sum()) == 0.0
    if not same_k:
        if k >= depth:
            return None
        x = int(tokens[k])
        q_x = 1.0 if point_mass else float(q[k, x])
        ratio = min(1.0, float(p[k, x]) / q_x)
        gap = abs(float(uniforms.accept[row, k]) - ratio)
        return f"accept k={k} |u-r|={gap:.1e}" if gap < TIE_EPS else None
    weights = p[k].double().clone()
    if k < depth:
        if point_mass:
            weights[int(tokens[k])] = 0.0
        else:
            weights = (weights - q[k].double()).clamp(min=0.0)
    cdf = weights.cumsum(0) / weights.sum()
    gap = float((cdf - float(uniforms.bonus[row])).abs().min())
    return f"bonus at k={k} |u-cdf|={gap:.1e}" if gap < TIE_EPS else None


def test_speculator_phases_hold_gpu_time(cuda: torch.device, pair: tuple[Path, Path]) -> None:
    """The engine's phases synchronise the device at their boundaries: a
    phase that launches a long kernel holds its GPU time, not the microseconds of its launch."""
    draft_path, _ = pair
    engine = engine_on(draft_path, cuda)
    assert engine.phases.sync is not None
    a = torch.randn(4096, 4096, device=cuda)
    torch.cuda.synchronize(cuda)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with engine.phases.phase("forward"):
        start.record()
        for _ in range(20):
            a = a @ a / 64.0
        end.record()
    gpu_s = start.elapsed_time(end) / 1e3
    assert engine.phases.seconds["forward"] >= 0.9 * gpu_s, (engine.phases.seconds, gpu_s)
