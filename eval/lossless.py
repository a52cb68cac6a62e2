"""`python -m eval.lossless`: SSD's greedy output equals autoregressive decoding on real prompts.

The full check of issue 5: 20 HumanEval prompts and 10 MT-Bench first turns × 128 new tokens on
the real pair, AR (`--speculative-algorithm NONE`) and SSD (defaults) served one after the other
(never two servers at once, so neither steals the other's cores), batch 1. Outputs must match
token for token, except at positions whose fp32 top-2 margin is below ε (DESIGN.md §1); those
are listed in the JSON with their margins.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.client import RequestResult, generate
from eval.datasets import HUMANEVAL, MTBENCH, Prompt, load_prompts, load_tokenizer
from eval.provenance import git_info, machine_info, versions
from eval.sampling import Sampling
from eval.servers import Server
from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path
from sglang_ssd.testing.greedy import DEFAULT_MARGIN_EPS, Divergence, check_greedy


def _serve_all(
    name: str, args: list[str], prompts: Sequence, sampling: Sampling, logs: Path
) -> tuple[list, dict]:
    with Server(name, args, log_path=logs / f"lossless-{name}.log") as server:
        results = [generate(server.url, p.record.id, p.input_ids, sampling) for p in prompts]
        info = dict(server.info)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{name}: {len(errors)} requests failed, first: {errors[0]}")
    return results, info


def _rows(
    prompts: Sequence[Prompt],
    ar: Sequence[RequestResult],
    ssd: Sequence[RequestResult],
    divergences: Sequence[Divergence | None],
) -> list[dict[str, Any]]:
    """One row per prompt: identical or where it diverged (with the fp32 margin there)."""
    rows = []
    for p, r_ar, r_ssd, d in zip(prompts, ar, ssd, divergences, strict=True):
        meta = r_ssd.meta_info
        rows.append(
            {
                "dataset": p.record.dataset,
                "id": p.record.id,
                "tokens": len(r_ssd.output_ids),
                "identical": d is None,
                "divergence": None
                if d is None
                else {"index": d.index, "ar": d.expected, "ssd": d.got, "fp32_margin": d.margin},
                "ssd_accept_length": meta.get("spec_accept_length"),
                "ssd_cache_hit_rate": meta.get("ssd_cache_hit_rate"),
                "ar_tok_per_s": r_ar.tok_per_s,
                "ssd_tok_per_s": r_ssd.tok_per_s,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.lossless", description=__doc__)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--mtbench", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eps", type=float, default=DEFAULT_MARGIN_EPS)
    parser.add_argument("--ssd-args", default="", help="extra SSD launcher flags")
    parser.add_argument("--out", type=Path, default=Path("eval/results/lossless-greedy.json"))
    a = parser.parse_args(argv)

    target, draft = model_path(TARGET_MODEL), model_path(DRAFT_MODEL)
    tokenizer = load_tokenizer(target)
    prompts = load_prompts(HUMANEVAL, tokenizer, n=a.humaneval)
    prompts += load_prompts(MTBENCH, tokenizer, n=a.mtbench)
    sampling = Sampling(max_new_tokens=a.max_new_tokens, temperature=0.0)
    logs = a.out.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.time()
    target_args = ["--model-path", str(target)]
    ar_args = [*target_args, "--speculative-algorithm", "NONE"]
    ar, ar_info = _serve_all("ar", ar_args, prompts, sampling, logs)
    ssd_args = [*target_args, "--speculative-draft-model-path", str(draft),
                "--speculative-algorithm", "SSD", *a.ssd_args.split()]  # fmt: skip
    ssd, ssd_info = _serve_all("ssd", ssd_args, prompts, sampling, logs)

    divergences, violations = check_greedy(
        target,
        [p.input_ids for p in prompts],
        [r.output_ids for r in ar],
        [r.output_ids for r in ssd],
        eps=a.eps,
    )
    rows = _rows(prompts, ar, ssd, divergences)
    report = {
        "kind": "lossless-greedy",
        "eps": a.eps,
        "passed": not violations,
        "violations": violations,
        "identical": sum(r["identical"] for r in rows),
        "prompts": len(rows),
        "rows": rows,
        "servers": {"ar": ar_info, "ssd": ssd_info},
        "seconds": time.time() - started,
        "machine": machine_info(),
        "versions": versions(),
        "git": git_info(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1, default=str))
    print(
        f"identical {report['identical']}/{len(rows)}; allowed divergences "
        f"{len(rows) - report['identical'] - len(violations)}; violations {len(violations)}"
    )
    for v in violations:
        print("  VIOLATION", v)
    print(f"wrote {a.out}")
    return 0 if not violations else 1


if __name__ == "__main__":
    raise SystemExit(main())
