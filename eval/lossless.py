"""`python -m eval.lossless`: SSD's greedy output equals autoregressive decoding on real prompts.

The full check: 20 HumanEval prompts and 10 MT-Bench first turns × 128 new tokens on
the real pair, AR (`--speculative-algorithm NONE`) and SSD (defaults) served one after the other
(never two servers at once, so neither steals the other's cores; SSD first, so that the AR
server also gives the continuations), batch 1. Outputs must match token for token, except at
positions whose fp32 top-2 margin is below ε (docs/design.md#the-greedy-rule, ε as measured by
`python -m eval.margin`). After such a position the AR server continues from SSD's
own prefix and the rest of SSD's output is compared against that, so every token of every output
is checked; each divergence is listed in the JSON with its margin, and each row carries the SSD
request's speculation-cache hit rate.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval import cli_options, configs
from eval.client import RequestResult, generate
from eval.datasets import HUMANEVAL, MTBENCH, Prompt, load_prompts, load_tokenizer
from eval.provenance import git_info, machine_info, versions
from eval.sampling import Sampling
from eval.servers import Server
from sglang_ssd.testing.greedy import (
    DEFAULT_MARGIN_EPS,
    ContinueFn,
    GreedyCheck,
    PromptCheck,
    check_greedy,
    margin_eps_source,
)


def _generate_all(
    name: str, server: Server, prompts: Sequence[Prompt], sampling: Sampling
) -> list[RequestResult]:
    """Every prompt, one at a time; raises RuntimeError naming the first failed request."""
    results = [generate(server.url, p.record.id, p.input_ids, sampling) for p in prompts]
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{name}: {len(errors)} requests failed, first: {errors[0]}")
    return results


def continuation(url: str) -> ContinueFn:
    """`continue_ar` for `check_greedy`: the server's greedy next ≤ n tokens after a context."""

    def continue_ar(context: Sequence[int], n: int) -> list[int]:
        r = generate(url, "continuation", context, Sampling(max_new_tokens=n, temperature=0.0))
        if r.error:
            raise RuntimeError(f"AR continuation failed: {r.error}")
        return r.output_ids

    return continue_ar


def _rows(
    prompts: Sequence[Prompt],
    ar: Sequence[RequestResult],
    ssd: Sequence[RequestResult],
    checks: Sequence[PromptCheck],
) -> list[dict[str, Any]]:
    """One row per prompt: its divergences (with fp32 margins), tokens checked, SSD's stats."""
    rows = []
    for p, r_ar, r_ssd, c in zip(prompts, ar, ssd, checks, strict=True):
        meta = r_ssd.meta_info
        rows.append(
            {
                "dataset": p.record.dataset,
                "id": p.record.id,
                "tokens": c.total,
                "checked": c.checked,
                "identical": c.identical,
                "divergences": [
                    {"index": d.index, "ar": d.expected, "ssd": d.got, "fp32_margin": d.margin}
                    for d in c.divergences
                ],
                "ssd_accept_length": meta.get("spec_accept_length"),
                "ssd_cache_hit_rate": meta.get("ssd_cache_hit_rate"),
                "ssd_rounds": meta.get("ssd_rounds"),
                "ar_tok_per_s": r_ar.tok_per_s,
                "ssd_tok_per_s": r_ssd.tok_per_s,
            }
        )
    return rows


def _summary(check: GreedyCheck, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    divergences = sum(len(r["divergences"]) for r in rows)
    return {
        "passed": check.passed,
        "violations": list(check.violations),
        "identical": sum(r["identical"] for r in rows),
        "prompts": len(rows),
        "divergences": divergences,
        "allowed_divergences": divergences - len(check.violations),
        "checked_tokens": check.checked,
        "total_tokens": check.total,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.lossless", description=__doc__)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--mtbench", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eps", type=float, default=DEFAULT_MARGIN_EPS)
    cli_options.add_ssd_args(parser)
    parser.add_argument("--note", default="", help="kept in the JSON (e.g. a smaller run)")
    parser.add_argument("--out", type=Path, default=Path("eval/results/lossless-greedy.json"))
    a = parser.parse_args(argv)

    target, draft = configs.default_model_dirs()
    tokenizer = load_tokenizer(target)
    prompts = load_prompts(HUMANEVAL, tokenizer, n=a.humaneval)
    prompts += load_prompts(MTBENCH, tokenizer, n=a.mtbench)
    sampling = Sampling(max_new_tokens=a.max_new_tokens, temperature=0.0)
    logs = a.out.parent / "logs"
    started = time.time()
    ar_cfg = configs.autoregressive(target, name="ar")
    ssd_cfg = configs.ssd(target, draft, name="ssd", extra=a.ssd_args.split())
    with ssd_cfg.server(logs) as server:
        ssd = _generate_all("ssd", server, prompts, sampling)
        ssd_info = dict(server.info)
    # AR after SSD, so that the same server also gives the continuations from SSD's prefixes.
    with ar_cfg.server(logs) as server:
        ar = _generate_all("ar", server, prompts, sampling)
        ar_info = dict(server.info)
        check = check_greedy(
            target,
            [p.input_ids for p in prompts],
            [r.output_ids for r in ar],
            [r.output_ids for r in ssd],
            continue_ar=continuation(server.url),
            eps=a.eps,
        )
    rows = _rows(prompts, ar, ssd, check.prompts)
    report = {
        "kind": "lossless-greedy",
        "note": a.note,
        "eps": a.eps,
        "eps_source": margin_eps_source() if a.eps == DEFAULT_MARGIN_EPS else "--eps",
        **_summary(check, rows),
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
        f"{report['allowed_divergences']}; violations {len(check.violations)}; "
        f"checked {check.checked}/{check.total} tokens"
    )
    for v in check.violations:
        print("  VIOLATION", v)
    print(f"wrote {a.out}")
    return 0 if check.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
