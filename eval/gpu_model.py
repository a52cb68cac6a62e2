"""A model of SSD on GPUs for large pairs, from GPU timings of random-weight models.

`python -m eval.gpu_model --out DIR` (CUDA; needs only torch and transformers, no sglang):

1. the target's verify: a Qwen2.5-32B-shaped target (`eval.gpu_target`, bf16, random weights,
   static KV cache) runs n = D + 1 tokens per request for batch b, and the AR step (n = 1), each
   captured as a `torch.cuda.CUDAGraph` and replayed (median of 10, CUDA events);
2. the speculator's round: the real `SpeculatorEngine` (eager, HF modules with the branch
   attention) over a Qwen2.5-0.5B-shaped draft (bf16, random weights), b greedy requests with a
   `--context`-token prompt; a hit-path round = apply the outcome that hits + serve + build (glue,
   fork, tree decode of depth D, populate) at fan-out budget B, median of `--reps`; and the
   just-in-time draft of D tokens (the backup on a miss, and synchronous SD's drafting);
3. the speedup model (`saguaro.expected_speedup`, Theorem 7 as corrected in
docs/design.md#speedup-model-theorem-7) for
   per-token acceptance α in {0.6, 0.7, 0.8, 0.9} and the real pair's rates (the CPU runs'
   components in eval/results/model-check.json), with γ = D, the hit model 1 - p_hit(F) = c F^-r
   of the real pair at the geometric fan-out (Theorem 12, `eval.model_check.Components`), and
   synchronous SD with the same timings: E(α, D) tokens per (T_jit + T_v).

Both models share one GPU here; in deployment the speculator has its own. Every timing is
written to DIR/gpu-model-<device>.json as soon as it is measured (a timeout keeps what was
done), with the predicted table recomputed each time. The file is labelled a model: the
acceptance and hit rates are assumed, not measured on these shapes. `--dry-run` runs the same
pipeline with tiny shapes on the CPU (for the unit test); without CUDA and without it, the
command refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eval.gpu_target import QWEN25_05B, QWEN25_32B, TINY_TARGET, Shape, StaticTarget
from eval.model_check import Components
from sglang_ssd.saguaro import expected_accept_length, expected_speedup

ALPHAS = (0.6, 0.7, 0.8, 0.9)
# The real pair's hit model and acceptance if eval/results/model-check.json is missing.
FALLBACK_HIT = {"hit_c": 0.46, "hit_r": 0.87}
LABEL = (
    "MODEL with measured GPU timings: random-weight models in real shapes timed on this GPU; "
    "acceptance and cache-hit rates are assumed (the alpha grid) or the real pair's CPU rates; "
    "not an end-to-end measurement"
)
ROOT = Path(__file__).resolve().parents[1]


def real_pair_rates(path: Path = ROOT / "eval" / "results" / "model-check.json") -> list[dict]:
    """The real pair's measured components (α, α_miss, c, r) per checked run, named by run."""
    if not path.is_file():
        return []
    rates = []
    for check in json.loads(path.read_text()).get("checks", []):
        comp = check["components"]
        name = f"real-pair {Path(check['target']).stem}"
        rates.append({"name": name, **{k: comp[k] for k in ("alpha", "alpha_miss")}})
        rates[-1].update(hit_c=comp["hit_c"], hit_r=comp["hit_r"], source=check["file"])
    return rates


def rate_grid() -> list[dict]:
    """α in `ALPHAS` (α_miss = α: the backup is the same draft, just in time; the real pair's
    hit model), then the real pair's own rates."""
    real = real_pair_rates()
    hit = {k: real[0][k] for k in ("hit_c", "hit_r")} if real else FALLBACK_HIT
    grid = [{"name": f"alpha={a}", "alpha": a, "alpha_miss": a, **hit} for a in ALPHAS]
    return grid + real


def predict(timings: dict[str, list[dict]], rates: Sequence[dict]) -> list[dict]:
    """SSD and synchronous SD speedups over AR for every speculator timing and rate set.

    Times: T_v = verify of D + 1 tokens at b, T_AR = the AR step at b (both the target's graph
    replays), T_p = the hit-path round, T_b = T_jit = the just-in-time draft of D tokens at b.
    Rows whose verify or jit timing is not measured yet are left out.
    """
    verify = {(t["batch"], t["tokens"]): t["seconds"] for t in timings["verify"]}
    jit = {(t["batch"], t["depth"]): t["seconds"] for t in timings["jit"]}
    rows = []
    for spec in timings["speculator"]:
        b, budget, depth = spec["batch"], spec["budget"], spec["depth"]
        t_v, t_ar, t_jit = verify.get((b, depth + 1)), verify.get((b, 1)), jit.get((b, depth))
        if t_v is None or t_ar is None or t_jit is None:
            continue
        for rate in rates:
            comp = Components(
                batch_size=b,
                lookahead=depth,
                depth=depth,
                budget=budget,
                t_verify=t_v,
                t_ar=t_ar,
                t_forward=0.0,
                t_fixed=spec["round_s"],
                alpha=rate["alpha"],
                alpha_miss=rate["alpha_miss"],
                hit_c=rate["hit_c"],
                hit_r=rate["hit_r"],
                coverage=1.0,
                t_backup=t_jit,
                p_hit=0.0,
            )
            p_hit = comp.p_hit_at(budget, depth)
            ssd = expected_speedup(
                rate["alpha"],
                rate["alpha_miss"],
                depth,
                p_hit,
                spec["round_s"] / t_v,
                t_jit / t_v,
                b,
                t_ar / t_v,
            )
            sd = expected_accept_length(rate["alpha"], depth) * t_ar / (t_jit + t_v)
            rows.append(
                {
                    "rates": rate["name"],
                    "batch": b,
                    "budget": budget,
                    "depth": depth,
                    "p_hit": p_hit,
                    "t_spec": spec["round_s"] / t_v,
                    "t_backup": t_jit / t_v,
                    "t_ar_over_t_verify": t_ar / t_v,
                    "ssd_speedup": ssd,
                    "sd_speedup": sd,
                    "ssd_over_sd": ssd / sd,
                }
            )
    return rows


class Results:
    """The JSON file, rewritten (atomically) after every measurement."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            **header,
            "status": "running",
            "timings": {"verify": [], "speculator": [], "jit": []},
            "rates": rate_grid(),
            "predictions": [],
        }
        self.write()

    def add(self, kind: str, row: dict[str, Any]) -> None:
        self.data["timings"][kind].append(row)
        self.data["predictions"] = predict(self.data["timings"], self.data["rates"])
        self.write()
        print(f"[gpu-model] {kind}: {row}", flush=True)

    def write(self, status: str | None = None) -> None:
        if status is not None:
            self.data["status"] = status
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def time_target(res: Results, shape: Shape, device: torch.device, args: argparse.Namespace):
    """Verify (n = D + 1) and AR-step (n = 1) timings of the target for every batch."""
    max_len = args.context + max(args.depths) + 1
    target = StaticTarget(shape, max(args.batches), max_len, device)
    for b in args.batches:
        for n in [1, *sorted({d + 1 for d in args.depths})]:
            seconds = target.time_forward(b, n, args.context, reps=args.reps_verify)
            res.add("verify", {"batch": b, "tokens": n, "seconds": seconds})
    del target
    if device.type == "cuda":
        torch.cuda.empty_cache()


def build_draft(shape: Shape, device: torch.device, dtype: torch.dtype, slots: int, root: Path):
    """A random-weight HF Qwen2 of `shape` as a `DraftModel` on `device` (via a folder)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sglang_ssd.speculator.draft_model import DraftModel

    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tie_embeddings,
        max_position_embeddings=32768,
        layer_types=["full_attention"] * shape.layers,
    )
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(root / "draft")
    del model
    return DraftModel.load(root / "draft", device=device, dtype=dtype, num_slots=slots)


def time_speculator(res: Results, model: Any, device: torch.device, args: argparse.Namespace):
    """Hit-path rounds for every (b, B, D) and the jit draft of D tokens for every (b, D)."""
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.speculator.engine import SpeculatorEngine

    gen = torch.Generator().manual_seed(0)
    lookahead = max(args.depths)
    for b in args.batches:
        for budget in args.budgets:
            config = SSDConfig(lookahead=lookahead, fanout_budget=budget)
            engine = SpeculatorEngine(model, config, seed=0)
            rids = [f"r{i}" for i in range(b)]
            for rid in rids:
                prompt = torch.randint(0, model.vocab_size, (args.context,), generator=gen)
                engine.open(rid, prompt.tolist(), temperature=0.0, top_k=1, top_p=1.0)
            for depth in args.depths:
                _time_depth(res, engine, rids, depth, budget == args.budgets[0], args, device)
            for rid in rids:
                engine.close(rid)


def _time_depth(
    res: Results,
    engine: Any,
    rids: list[str],
    depth: int,
    with_jit: bool,
    args: argparse.Namespace,
    device: torch.device,
) -> None:
    """At tree depth D = `depth`: the jit draft of D tokens (if `with_jit`), then hit rounds."""
    b, budget = len(rids), engine.config.fanout_budget
    if with_jit:
        seconds = _median(
            lambda: engine.serve(rids, backup="jit", depth=depth),
            args.reps,
            device,
            setup=lambda: _miss(engine, rids),
        )
        res.add("jit", {"batch": b, "depth": depth, "seconds": seconds})
    _miss(engine, rids)
    engine.serve(rids, backup="jit", depth=depth)
    engine.build(rids, depth)
    round_s = _median(lambda: _hit_round(engine, rids, depth), args.reps, device)
    row = {"batch": b, "budget": budget, "depth": depth, "round_s": round_s}
    row["fanout"] = engine.fanout(depth)
    res.add("speculator", row)


def _miss(engine: Any, rids: list[str]) -> None:
    """Apply an outcome that misses the cache for every request (its branches are freed), so
    that the next serve drafts just in time."""
    engine.apply_outcomes([_outcome(engine, rid, hit=False) for rid in rids])


def _hit_round(engine: Any, rids: list[str], depth: int) -> None:
    """Apply an outcome that hits for every request, serve (the hits), build the next round."""
    engine.apply_outcomes([_outcome(engine, rid, hit=True) for rid in rids])
    engine.serve(rids, backup="jit", depth=depth)
    engine.build(rids, depth)


def _outcome(engine: Any, rid: str, hit: bool) -> Any:
    """The deepest outcome whose branch the cache holds (hit), else k = 0 with a bonus token
    no branch forked (a miss; any outstanding draft has d_1 .. so k = 0 is always valid)."""
    from sglang_ssd.speculator.engine import OutcomeIn

    state = engine.requests[rid]
    branches = state.branches
    if hit and branches is not None:
        last = max(range(len(branches.ks)), key=lambda i: branches.ks[i])
        return OutcomeIn(rid, branches.ks[last], branches.bonus[last])
    forked = (
        set()
        if branches is None
        else {t for k, t in zip(branches.ks, branches.bonus, strict=True) if k == 0}
    )
    return OutcomeIn(rid, 0, min(set(range(len(forked) + 1)) - forked))


def _median(
    call: Callable[[], Any],
    reps: int,
    device: torch.device,
    setup: Callable[[], Any] | None = None,
) -> float:
    """Median wall seconds of `call` over `reps` runs after one warm-up (device synced before
    and after); `setup`, untimed, runs before each."""
    times = []
    for i in range(reps + 1):
        if setup is not None:
            setup()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.gpu_model", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu-model-*.json")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    parser.add_argument("--reps", type=int, default=3, help="timed speculator rounds")
    parser.add_argument("--reps-verify", type=int, default=10, help="timed graph replays")
    parser.add_argument("--skip-target", action="store_true", help="speculator timings only")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, target, draft, dtype = torch.device("cpu"), TINY_TARGET, TINY_TARGET, torch.float32
        name = "dry-run"
    elif not torch.cuda.is_available():
        print("eval.gpu_model: no CUDA device (use --dry-run for the CPU pipeline check)")
        return 2
    else:
        device, target, draft, dtype = torch.device("cuda"), QWEN25_32B, QWEN25_05B, torch.bfloat16
        name = torch.cuda.get_device_name(0).lower().replace(" ", "-")
    args.out.mkdir(parents=True, exist_ok=True)
    header = {
        "schema": "sglang-ssd-gpu-model/1",
        "label": LABEL,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": name,
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "method": {
            "verify": "target forward of n = D + 1 tokens (n = 1: the AR step) at a context of "
            "`context` cached tokens, static KV cache, torch.cuda.CUDAGraph replay timed with "
            "CUDA events, median of reps_verify (eager and perf_counter on the CPU dry run)",
            "speculator": "SpeculatorEngine (eager, HF modules + branch attention), greedy "
            "requests; round_s = apply a hitting outcome + serve + build, median of reps; jit "
            "= serve of a D-token just-in-time draft",
            "model": "expected_speedup (Theorem 7, docs/design.md#speedup-model-theorem-7) "
            "with gamma = D, "
            "p_hit from the hit model at the geometric fan-out; SD = E(alpha, D) T_AR / "
            "(T_jit + T_v)",
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"dtype": str(dtype)},
        "shapes": {"target": vars(target), "draft": vars(draft)},
        "params": {"target": target.params(), "draft": draft.params()},
    }
    res = Results(args.out / f"gpu-model-{name}.json", header)
    if not args.skip_target:
        time_target(res, target, device, args)
    slots = max(args.batches) * (args.context + max(args.budgets) * max(args.depths) * 2 + 64)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_draft(draft, device, dtype, slots, Path(tmp))
    time_speculator(res, model, device, args)
    res.write("complete")
    print(f"[gpu-model] wrote {res.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
