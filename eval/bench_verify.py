"""Micro-benchmark of `sglang_ssd.saguaro.verify` on CPU at V = 151,936 (Qwen2.5 vocabulary).

Times one `verify` call (target sampling transform + acceptance + bonus sampling) for B = 1, 8, 64
requests with D = 4 draft tokens, for four cases:
- sampled: temperature 1, no top-k/top-p, sampled q rows (the plain softmax path);
- greedy: temperature 0 (argmax only);
- top_p_peaked: temperature 0.7, top_p 0.95 on Zipf-like logits (a nucleus of tens of tokens:
  the 1024-rank prefix path);
- top_p_wide: the same on N(0, 9) logits, whose nucleus is ~1,000 tokens: rows wider than the
  1024-rank prefix fall back to a full sort of the vocabulary, as SGLang's torch sampler always
  does (the slow case).
The mean nucleus width (tokens with p > 0) is reported per case.
Writes eval/results/bench_verify.json with the machine's description. The machine may be shared:
the load average before and after is recorded with the numbers.

Usage: python -m eval.bench_verify [--threads 1,2] [--repeats R] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from eval.provenance import cpu_summary
from sglang_ssd.saguaro import SamplingBatch, apply_sampling, verify

VOCAB = 151_936
DEPTH = 4
BATCHES = (1, 8, 64)


def _logits(batch: int, positions: int, peaked: bool, gen: torch.Generator) -> torch.Tensor:
    if not peaked:
        return 3.0 * torch.randn(batch, positions, VOCAB, generator=gen)
    # Zipf-like ranks (logit -log rank) in a random order per row, plus noise.
    ranks = torch.rand(batch, positions, VOCAB, generator=gen).argsort(dim=-1).float() + 1.0
    return -1.0 * ranks.log() + 0.3 * torch.randn(batch, positions, VOCAB, generator=gen)


CASES = {
    "sampled": dict(temperature=1.0, top_p=1.0, peaked=False),
    "greedy": dict(temperature=0.0, top_p=1.0, peaked=False),
    "top_p_peaked": dict(temperature=0.7, top_p=0.95, peaked=True),
    "top_p_wide": dict(temperature=0.7, top_p=0.95, peaked=False),
}


def bench_case(batch: int, case: dict, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(batch)
    target_logits = _logits(batch, DEPTH + 1, case["peaked"], gen)
    sampling = SamplingBatch.uniform(batch, case["temperature"], top_p=case["top_p"])
    draft_sampling = SamplingBatch.uniform(batch, 1.0)
    q = apply_sampling(_logits(batch, DEPTH, case["peaked"], gen), draft_sampling)
    tokens = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=gen).reshape(batch, DEPTH)
    p = apply_sampling(target_logits, sampling)
    nucleus = float((p > 0).sum(-1).float().mean())
    verify_gen = torch.Generator().manual_seed(0)
    verify(target_logits, tokens, q, sampling, generator=verify_gen)  # warm-up
    times = []
    accepted = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        result = verify(target_logits, tokens, q, sampling, generator=verify_gen)
        times.append((time.perf_counter() - start) * 1e3)
        accepted += float(result.accept_len.float().mean()) / repeats
    return {
        "batch": batch,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "repeats": repeats,
        "mean_nucleus_tokens": nucleus,
        "mean_accept_len": accepted,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_verify", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--threads",
        default="1,2",
        help="comma-separated torch thread counts to run (default 1,2: one pass each)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("eval/results/bench_verify.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        print(f"verify, CPU, V = {VOCAB}, D = {DEPTH}, {threads} torch thread(s)")
        print(f"{'case':<14}{'B':>4}{'median ms':>12}{'min ms':>10}{'nucleus':>10}")
        for name, case in CASES.items():
            for batch in BATCHES:
                repeats = args.repeats if name != "top_p_wide" or batch < 64 else 2
                row = {"case": name, "threads": threads, **bench_case(batch, case, repeats)}
                rows.append(row)
                print(
                    f"{name:<14}{batch:>4}{row['median_ms']:>12.1f}{row['min_ms']:>10.1f}"
                    f"{row['mean_nucleus_tokens']:>10.0f}"
                )
    report = {
        "benchmark": "sglang_ssd.saguaro.verify",
        "vocab_size": VOCAB,
        "draft_length": DEPTH,
        "device": "cpu",
        "cases": {name: {k: v for k, v in case.items()} for name, case in CASES.items()},
        "results": rows,
        "note": "median and min of repeated calls after one warm-up; the 2-core machine may be "
        "shared (see the load averages), in which case min_ms is the least disturbed figure",
        "machine": cpu_summary(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
