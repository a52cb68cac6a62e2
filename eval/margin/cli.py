"""`python -m eval.margin` (or `python -m eval margin`): measure ε of the greedy rule on the real
pair (see `eval.margin`).

Writes eval/results/margin-eps.json after every segment (resumable: a rerun continues the saved
chains unless --fresh), then the fp32 margins at the differing positions and ε once the servers
are stopped. Budget: --positions measured positions or --max-minutes of measuring, whichever
comes first; `complete` in the JSON says whether --positions were reached.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from itertools import chain as concat
from itertools import zip_longest
from pathlib import Path
from typing import Any

from eval import cli_options, configs
from eval.datasets import HUMANEVAL, MTBENCH, Prompt, load_prompts, load_tokenizer
from eval.margin.chains import Chain, make_chains, restore_all, save
from eval.margin.eps import fill_fp32_margins, summarize
from eval.margin.measure import Budget, Measurer
from eval.provenance import run_header, versions

OUT = Path("eval/results/margin-eps.json")
LOGS = Path("eval/logs/margin")


def _prompts(a: argparse.Namespace, tokenizer: Any) -> tuple[list[Prompt], list[Prompt]]:
    """The lossless set (first --humaneval and --mtbench), and with --extra the rest of both
    sets interleaved, for when the lossless prompts stop before --positions."""
    he, mt = load_prompts(HUMANEVAL, tokenizer), load_prompts(MTBENCH, tokenizer)
    lossless = he[: a.humaneval] + mt[: a.mtbench]
    pairs = zip_longest(he[a.humaneval :], mt[a.mtbench :])
    extra = [p for p in concat.from_iterable(pairs) if p is not None] if a.extra else []
    return lossless, extra


def _measure(
    a: argparse.Namespace, chains: list[Chain], header: dict[str, Any], target: Path, draft: Path
) -> None:
    ar_cfg = configs.autoregressive(target)
    ssd_cfg = configs.ssd(target, draft, extra=a.ssd_args.split())
    started = time.time()
    budget = Budget(a.positions, started + 60 * a.max_minutes, a.segment_tokens, a.max_tokens)
    with contextlib.ExitStack() as stack:
        ar = stack.enter_context(ar_cfg.server(a.log_dir))
        ssd = stack.enter_context(ssd_cfg.server(a.log_dir))
        header["servers"] = {"ar": dict(ar.info), "ssd": dict(ssd.info)}
        t0, n0 = time.time(), sum(c.positions for c in chains)

        def on_segment() -> None:
            save(a.out, header, chains)
            n = sum(c.positions for c in chains)
            rate = (n - n0) / max(time.time() - t0, 1e-9)
            print(
                f"{n} positions, {rate:.2f}/s, {sum(len(c.differing) for c in chains)} "
                f"differing, {time.time() - started:.0f} s",
                flush=True,
            )

        Measurer(ar.url, ssd.url, chains, budget, on_segment).run(a.streams)
    header["measure_seconds"] = time.time() - started


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line's options (also `python -m eval margin`'s)."""
    parser.add_argument("--humaneval", type=int, default=20, help="lossless HumanEval prompts")
    parser.add_argument("--mtbench", type=int, default=10, help="lossless MT-Bench prompts")
    parser.add_argument(
        "--no-extra",
        dest="extra",
        action="store_false",
        help="never go beyond the lossless prompts",
    )
    parser.add_argument("--positions", type=int, default=10_000, help="positions to measure")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=60.0,
        help="measuring wall limit (0: only margins and ε from the saved chains)",
    )
    parser.add_argument("--streams", type=int, default=8, help="prompts in flight per server")
    parser.add_argument("--segment-tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--max-tokens", type=int, default=384, help="output tokens per prompt")
    cli_options.add_ssd_args(parser)
    parser.add_argument("--fresh", action="store_true", help="ignore a saved run in --out")
    parser.add_argument("--note", default="", help="kept in the JSON (e.g. why it is partial)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--log-dir", type=Path, default=LOGS, help="server logs")


def run(a: argparse.Namespace) -> int:
    """Measure (or resume), then fp32 margins and ε into `a.out`."""
    target, draft = configs.default_model_dirs()
    lossless, extra = _prompts(a, load_tokenizer(target))
    chains = make_chains(lossless, extra)
    resumed, earlier = (0, []) if a.fresh else restore_all(chains, a.out)
    header: dict[str, Any] = {
        "kind": "margin-eps",
        "note": a.note,
        **run_header("eval" if hasattr(a, "func") else "eval.margin", sys.argv[1:]),
        "versions": versions(),
        "settings": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items() if k != "func"
        },
        "resumed_chains": resumed,
        "earlier_runs": earlier,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    wanted = sum(c.positions for c in chains) < a.positions and not all(c.done for c in chains)
    if wanted and a.max_minutes > 0:
        _measure(a, chains, header, target, draft)
    print(f"fp32 margins at {fill_fp32_margins(chains, target)} new differing positions")
    summary = summarize(chains, a.positions)
    save(a.out, {**header, "summary": summary}, chains)
    print(
        f"eps {summary['eps']} ({summary['eps_rule']}); {summary['positions']} positions "
        f"({summary['positions_lossless_prompts']} on the lossless prompts), "
        f"{summary['differing_count']} differing; wrote {a.out}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.margin", description=__doc__)
    add_arguments(parser)
    a = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on SIGTERM
    return run(a)
