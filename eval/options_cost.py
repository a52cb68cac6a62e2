"""`python -m eval options`: what each request option costs SSD.

One SSD server (launcher defaults, the real pair); for each option, every prompt is sent with
the option and without it, alternating which goes first (A B, then B A on the next prompt),
batch 1, greedy. The cost of an option is the ratio of tok/s with it to tok/s without it on the
same prompts (summed tokens over summed seconds), with a 90% bootstrap interval over prompts;
the accept length and cache hit rate of both sides come from each response's `meta_info`.
Written to `eval/results/options-cost-b1.json` as each option finishes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eval import bootstrap, client, datasets
from eval.sampling import Sampling
from eval.servers import Server
from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path

OUT = Path("eval/results/options-cost-b1.json")
SCHEMA = {
    "type": "object",
    "properties": {
        "function": {"type": "string", "maxLength": 32},
        "arguments": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "returns": {"type": "string", "maxLength": 32},
    },
    "required": ["function", "arguments", "returns"],
}
OPTIONS: dict[str, dict[str, Any]] = {
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "logit_bias": {"logit_bias": {"220": 1.0, "198": -1.0}},
    "min_new_tokens": {"min_new_tokens": 48},
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
    "regex": {"regex": r"(    [a-z_]+ = [a-z_0-9()+*, ]+\n){1,8}"},
}


def _side(results: list[client.RequestResult]) -> dict[str, Any]:
    tokens = sum(r.completion_tokens for r in results)
    seconds = sum(r.latency_s for r in results)
    meta = [r.meta_info for r in results]

    def mean(key: str) -> float | None:
        values = [m[key] for m in meta if m.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {
        "tokens": tokens,
        "seconds": seconds,
        "tok_per_s": tokens / seconds if seconds else 0.0,
        "accept_length": mean("spec_accept_length"),
        "accept_rate": mean("spec_accept_rate"),
        "cache_hit_rate": mean("ssd_cache_hit_rate"),
    }


def params_for(name: str, max_new_tokens: int) -> dict[str, Any]:
    """`OPTIONS[name]`, with `min_new_tokens` at most 3/4 of `max_new_tokens` (SGLang answers
    HTTP 400 to a minimum above the maximum; the default 64 keeps 48)."""
    params = dict(OPTIONS[name])
    if "min_new_tokens" in params:
        params["min_new_tokens"] = min(params["min_new_tokens"], max_new_tokens * 3 // 4)
    return params


def run(prompts: int, max_new_tokens: int, only: list[str]) -> dict[str, Any]:
    """Measure every option in `only` (all when empty); returns the results document."""
    target, draft = model_path(TARGET_MODEL, pull=True), model_path(DRAFT_MODEL, pull=True)
    tokenizer = datasets.load_tokenizer(target)
    chosen = datasets.load_prompts(datasets.HUMANEVAL, tokenizer, n=prompts)
    names = only or list(OPTIONS)
    doc: dict[str, Any] = {
        "what": "tok/s of SSD with each option over the same request without it",
        "dataset": datasets.HUMANEVAL,
        "prompts": [p.id for p in chosen],
        "max_new_tokens": max_new_tokens,
        "batch_size": 1,
        "temperature": 0.0,
        "server": "python -m sglang_ssd.launch_server (defaults, real pair)",
        "options": {},
    }
    args = ["--model-path", str(target), "--speculative-draft-model-path", str(draft)]
    plain = Sampling.of(0.0, max_new_tokens=max_new_tokens)
    log = Path("eval/logs/options/ssd.log")
    with Server("ssd-options", [*args, "--speculative-algorithm", "SSD"], log_path=log) as server:
        bar = tqdm(total=len(names) * len(chosen) * 2, desc="options", unit="req")
        for name in names:
            params = params_for(name, max_new_tokens)
            shaped = Sampling.of(0.0, max_new_tokens=max_new_tokens, options=json.dumps(params))
            runs: dict[str, list[client.RequestResult]] = {"with": [], "without": []}
            for i, prompt in enumerate(chosen):
                order = [("with", shaped), ("without", plain)]
                for side, sampling in order if i % 2 == 0 else order[::-1]:
                    result = client.generate(server.url, prompt.id, prompt.input_ids, sampling)
                    if result.error:
                        raise RuntimeError(f"{name} / {prompt.id}: {result.error}")
                    runs[side].append(result)
                    bar.update()
            work = {
                side: {r.prompt_id: (r.completion_tokens, r.latency_s) for r in results}
                for side, results in runs.items()
            }
            with_, without = _side(runs["with"]), _side(runs["without"])
            doc["options"][name] = {
                "params": params,
                "with": with_,
                "without": without,
                "ratio": with_["tok_per_s"] / without["tok_per_s"],
                "ratio_90": bootstrap.ratio_interval(work["with"], work["without"]),
            }
            OUT.write_text(json.dumps(doc, indent=1))
        bar.close()
    return doc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`python -m eval options` flags."""
    p.add_argument("--prompts", type=int, default=4, help="first N HumanEval prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--only", nargs="*", default=[], choices=list(OPTIONS), help="these options")


def cli(a: argparse.Namespace) -> int:
    """Run, then print one line per option."""
    doc = run(a.prompts, a.max_new_tokens, a.only)
    for name, row in doc["options"].items():
        low, high = row["ratio_90"] or (float("nan"), float("nan"))
        accept = (row["with"]["accept_length"], row["without"]["accept_length"])
        print(
            f"{name:20s} {row['ratio']:.2f}x [{low:.2f}, {high:.2f}]  "
            f"accept length {accept[0]:.2f} with, {accept[1]:.2f} without"
        )
    return 0
