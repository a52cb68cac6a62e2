"""`python -m eval outcomes`: which outcomes the speculation cache holds, measured offline.

`record` decodes HumanEval prompts with the target verifying the speculator's drafts in one
process (`eval.trace.record`: transformers target, `SpeculatorEngine`, async mode, β = 1) and
keeps, for every round, the draft in flight's own numbers once the next cache is built: its
tokens, each fork point's candidates with the draft's probabilities, the draft's probability of
each drafted token, the q at the candidates (sampled requests), and the verified outcome (k, t*).
The engine records with ``predicted`` fan-out at the largest budget to replay, so that every
round keeps B + 1 candidates per fork point.

`replay` runs each allocation (``geometric``, ``uniform``, ``predicted``) at each budget B on the
same recorded rounds, in order, with the live statistics each one keeps (α and r, or the outcome
model's calibration) fed by the recorded outcomes only, and counts a hit when (k, t*) is among
the outcomes allocated: t* within the first F_k candidates at k other than d_{k+1}. It writes
hit rate against B per shape and temperature as JSON, and a figure in the style of the paper's
Fig. 4. What it measures is the allocation's prediction quality: the drafts are the recorded
ones, not those another allocation's hits and misses would have produced in a live run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eval import cli_options, datasets
from eval.provenance import model_info, run_header
from eval.sampling import Sampling
from eval.trace.record import add_recording_options, load_recording, record_prompt, summarize
from sglang_ssd.config import FANOUT_SHAPES, SSDConfig
from sglang_ssd.saguaro.outcome_model import DraftEvidence, bonus_features
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.fanout_plan import LiveFanout, draft_evidence
from sglang_ssd.speculator.state import RequestState

RESULTS = Path("eval/results")
BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32)
DIGITS = 5  # probabilities are stored rounded: the trace stays small, the ranking unchanged


def capture(state: RequestState) -> dict[str, Any] | None:
    """The draft in flight's evidence as JSON (None without candidates' probabilities)."""
    e = draft_evidence(state.draft, state.is_greedy)
    if e is None:
        return None

    def rounded(t: torch.Tensor) -> list:
        return torch.round(t.float().cpu(), decimals=DIGITS).tolist()

    return {
        "tokens": e.tokens.tolist(),
        "candidates": e.candidates.tolist(),
        "probs": rounded(e.probs),
        "token_probs": rounded(e.token_probs),
        "q_cands": None if e.q_cands is None else rounded(e.q_cands),
        "greedy": e.greedy,
    }


def evidence_of(entry: dict[str, Any]) -> DraftEvidence:
    """A recorded round's evidence (`capture`) as the outcome model's input.

    Raises:
        ValueError: when the shapes do not agree (a damaged trace).
    """
    tokens = torch.tensor(entry["tokens"], dtype=torch.int64)
    candidates = torch.tensor(entry["candidates"], dtype=torch.int64)
    probs = torch.tensor(entry["probs"], dtype=torch.float32)
    depth = tokens.numel()
    if candidates.shape != probs.shape or candidates.shape[0] != depth + 1:
        raise ValueError(f"evidence shapes {tuple(candidates.shape)} / {tuple(probs.shape)}")
    q = entry.get("q_cands")
    return DraftEvidence(
        tokens=tokens,
        candidates=candidates,
        probs=probs,
        token_probs=torch.tensor(entry["token_probs"], dtype=torch.float32).view(depth),
        q_cands=None if q is None else torch.tensor(q, dtype=torch.float32).view(depth, -1),
        greedy=bool(entry["greedy"]),
    )


def replay_rounds(
    rounds: Sequence[dict[str, Any]], shape: str, budget: int, lookahead: int, vocab_size: int
) -> dict[str, Any]:
    """Hit rate of allocation `shape` at budget B over recorded rounds (with evidence), in
    order, the live statistics learning from each round's outcome after its allocation.

    Returns:
        shape, budget, rounds, hits, hit_rate, and hits / rounds by accept length k.

    Raises:
        ValueError: when a round keeps fewer than B + 1 candidates (recorded at a smaller B).
    """
    live = LiveFanout()
    config = SSDConfig(lookahead=lookahead, fanout=shape, fanout_budget=budget)  # type: ignore[arg-type]
    hits, by_k, hits_by_k = 0, [0] * (lookahead + 1), [0] * (lookahead + 1)
    used = [r for r in rounds if r.get("evidence") is not None]
    for r in used:
        e = evidence_of(r["evidence"])
        if e.candidates.shape[1] < min(budget, vocab_size - 1) + 1:
            raise ValueError(f"a round keeps {e.candidates.shape[1]} candidates; B = {budget}")
        (fanout,) = live.plan(config, vocab_size).allocate([e], [e.depth])
        k, bonus = int(r["accept_len"]), int(r["bonus"])
        _, valid = bonus_features(e)
        allowed = e.candidates[k][valid[k]][: fanout[k]]
        hit = bool((allowed == bonus).any())
        hits += hit
        by_k[k] += 1
        hits_by_k[k] += hit
        live.observe_accepted(k, e.depth)
        live.outcomes.observe(e, k, bonus)
        live.observe_hit(fanout[k], hit)
    n = len(used)
    return {
        "fanout": shape,
        "budget": budget,
        "rounds": n,
        "hits": hits,
        "hit_rate": hits / n if n else 0.0,
        "rounds_by_k": by_k,
        "hits_by_k": hits_by_k,
    }


def replay_trace(
    trace: dict[str, Any], budgets: Sequence[int], shapes: Sequence[str]
) -> list[dict[str, Any]]:
    """`replay_rounds` for every shape and budget on one trace (tagged with its sampling)."""
    gamma = int(trace["ssd_config"]["lookahead"])
    vocab = int(trace["vocab_size"])
    name = Sampling(**trace["sampling"]).name
    return [
        {"trace": name, **replay_rounds(trace["rounds"], s, b, gamma, vocab)}
        for s in shapes
        for b in budgets
    ]


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Hit rate by trace and B, one column per shape."""
    shapes = [s for s in FANOUT_SHAPES if any(r["fanout"] == s for r in results)]
    by_key = {(r["trace"], r["budget"], r["fanout"]): r["hit_rate"] for r in results}
    lines = [f"{'trace':>7} {'B':>3} | " + " ".join(f"{s:>9}" for s in shapes)]
    for trace, budget in sorted({(r["trace"], r["budget"]) for r in results}):
        cells = [by_key.get((trace, budget, s)) for s in shapes]
        row = " ".join(f"{c:9.3f}" if c is not None else " " * 8 + "-" for c in cells)
        lines.append(f"{trace:>7} {budget:>3} | {row}")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], out: Path) -> None:
    """Hit rate against B, one panel per trace, one line per shape (the paper's Fig. 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({r["trace"] for r in results})
    fig, axes = plt.subplots(1, len(traces), figsize=(4.5 * len(traces), 3.6), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        for shape in FANOUT_SHAPES:
            rows = sorted(
                (r for r in results if r["trace"] == trace and r["fanout"] == shape),
                key=lambda r: r["budget"],
            )
            if rows:
                ax.plot(
                    [r["budget"] for r in rows], [r["hit_rate"] for r in rows], "o-", label=shape
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("fan-out budget B (cached outcomes per request)")
        ax.set_ylabel("cache hit rate")
        ax.set_title(f"{trace} ({rows[0]['rounds'] if rows else 0} recorded rounds)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def cmd_record(a: argparse.Namespace) -> int:
    """Record one trace with evidence per temperature into `a.out_dir`."""
    target_dir, draft_dir, prompts, target, model = load_recording(a)
    config = SSDConfig(
        lookahead=a.lookahead, beta=1.0, fanout="predicted", fanout_budget=max(a.budgets)
    )
    for temperature in a.temperatures:
        sampling = Sampling.of(temperature)
        engine = SpeculatorEngine(model, config, seed=a.seed)
        t0 = time.perf_counter()
        out = a.out_dir / f"outcomes-trace-{sampling.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        body: dict[str, Any] = {
            "sampling": sampling.verify_params(),
            "seed": a.seed,
            "max_new_tokens": a.max_new_tokens,
            "ssd_config": json.loads(engine.config.to_json()),
            "prompts": [],
            "rounds": [],
        }
        for i, prompt in enumerate(prompts):  # the trace is rewritten after each prompt
            output, rounds = record_prompt(
                target,
                engine,
                i,
                prompt.input_ids,
                sampling,
                a.max_new_tokens,
                model.eos_token_ids,
                a.seed,
                capture,
            )
            body["prompts"].append(
                {"index": i, "input_ids": list(prompt.input_ids), "output_tokens": output}
            )
            body["rounds"] += [dataclasses.asdict(r) for r in rounds]
            body["summary"] = summarize(body["rounds"])
            print(f"  {sampling.name} prompt {i}: {len(rounds)} rounds", flush=True)
            trace = {
                "kind": "ssd-outcomes",
                **run_header("eval outcomes", sys.argv[1:]),
                "complete": i == len(prompts) - 1,
                "models": {"target": model_info(target_dir), "draft": model_info(draft_dir)},
                "dataset": {"source": datasets.source_info(datasets.HUMANEVAL)},
                "vocab_size": engine.vocab_size,
                "torch_threads": torch.get_num_threads(),
                "seconds": time.perf_counter() - t0,
                **body,
            }
            out.write_text(json.dumps(trace) + "\n")
        s = body["summary"]
        print(f"{sampling.name}: {s['rounds']} rounds, hit rate {s['hit_rate']:.3f} -> {out}")
    return 0


def cmd_replay(a: argparse.Namespace) -> int:
    """Replay every shape and budget on each trace; JSON to `a.out`, figure to `a.figure`."""
    results = []
    sources = []
    for path in a.traces:
        trace = json.loads(path.read_text())
        if trace.get("kind") != "ssd-outcomes":
            raise SystemExit(f"{path}: not an `eval outcomes record` trace")
        results += replay_trace(trace, a.budgets, a.fanouts)
        sources.append({"file": str(path), "models": trace.get("models"), **trace["summary"]})
    report = {
        "kind": "ssd-outcomes-replay",
        **run_header("eval outcomes", sys.argv[1:]),
        "traces": sources,
        "results": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(results))
    if a.figure is not None:
        plot(results, a.figure)
        print(f"wrote {a.out} and {a.figure}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m eval outcomes {record,replay}`'s options."""
    sub = parser.add_subparsers(dest="outcomes_command", required=True)
    p = sub.add_parser("record", help="record rounds with the draft's probabilities (real pair)")
    add_recording_options(p, 8, RESULTS)
    p.add_argument(
        "--budgets", type=int, nargs="+", default=list(BUDGETS),
        help="the largest sets the candidates kept per fork point (B + 1)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--kv-slots", type=int, default=16384, help="draft KV pool tokens")
    cli_options.add_pair(p)
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("replay", help="hit rate against B of each allocation on recorded rounds")
    p.add_argument("traces", type=Path, nargs="+", help="`record`'s trace files")
    p.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    p.add_argument("--fanouts", nargs="+", choices=FANOUT_SHAPES, default=list(FANOUT_SHAPES))
    p.add_argument("--out", type=Path, default=RESULTS / "outcomes-replay.json")
    p.add_argument("--figure", type=Path, default=RESULTS / "figures" / "outcomes-hit-rate.png")
    p.set_defaults(func=cmd_replay)
