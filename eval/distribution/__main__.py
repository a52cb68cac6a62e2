"""`python -m eval.distribution {power,run}`: the command line of `eval.distribution`.

power  print the power table of the χ² check (no servers; about 30 s): per samples-per-prompt,
       the TV each direction resolves at 90% power and the power at TV 0.03; `--find` adds
       the fewest samples per prompt that resolve TV 0.03 in each direction.
run    the full-size check against real tiny servers it starts itself (AR, then one SSD server
       under three settings), with the power table and the negative controls, into
       eval/results/distribution-full.json.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from eval.distribution.draws import NEW_TOKENS
from eval.distribution.power import (
    CI_SAMPLES,
    FULL_SAMPLES,
    POWER,
    TARGET_TV,
    broken_rejection_rates,
    directions,
    power_row,
    size_for_power,
)
from eval.distribution.run import run
from eval.distribution.tiny_pair import BROKEN, prepare_pair
from eval.provenance import run_header

RESULTS = Path("eval/results")
LOGS = Path("eval/logs")


def cmd_power(a: argparse.Namespace, argv: Sequence[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cells = prepare_pair(Path(tmp), a.tokens).cells
    for n in a.sizes:
        print(power_row(cells, n, a.tv), flush=True)
    largest = max(a.sizes)
    for name, row in broken_rejection_rates(cells, list(BROKEN), largest).items():
        rate = row["rejection_rate"]
        print(f"{name}: TV per prompt {row['tv']}, rejection rate at {largest}: {rate}")
    if a.find:
        refs = [c.probs["target"] for c in cells]
        for name, alternatives in directions(cells).items():
            try:
                n = size_for_power(refs, alternatives, a.tv)
            except ValueError as exc:
                print(f"{name}: {exc}")
                continue
            print(f"{name}: {n} samples per prompt resolve TV {a.tv} at {POWER:.0%} power")
    return 0


def cmd_run(a: argparse.Namespace, argv: Sequence[str]) -> int:
    size = "full" if a.samples == FULL_SAMPLES else str(a.samples)
    out = a.out or RESULTS / f"distribution-{size}.json"
    results = run(
        a.samples,
        [CI_SAMPLES],
        out,
        a.log_dir,
        run_header("eval.distribution", argv),
        progress=lambda line: print(line, flush=True),
        resume=a.resume,
    )
    print(f"verdict: {results['verdict']}\nwrote {out}")
    return 0 if results["verdict"] == "pass" else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m eval.distribution",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("power", help="the power table (no servers)")
    sizes = [CI_SAMPLES, FULL_SAMPLES]
    p.add_argument("sizes", nargs="*", type=int, default=sizes, help="samples per prompt")
    p.add_argument("--tokens", type=int, default=NEW_TOKENS, help="generated tokens per sample")
    p.add_argument("--tv", type=float, default=TARGET_TV, help="the bias whose power is shown")
    p.add_argument("--find", action="store_true", help="also the size that resolves --tv")
    p.set_defaults(func=cmd_power)

    p = sub.add_parser("run", help="the full-size check against live tiny servers")
    p.add_argument("--samples", type=int, default=FULL_SAMPLES, help="samples per prompt")
    p.add_argument(
        "--out", type=Path, help="results JSON (default eval/results/distribution-full.json)"
    )
    p.add_argument("--log-dir", type=Path, default=LOGS / "distribution", help="server logs")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the configurations --out already holds at this size, sample the others",
    )
    p.set_defaults(func=cmd_run)

    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    # SIGTERM must unwind like Ctrl-C, so that the servers' context managers stop them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return a.func(a, argv)


if __name__ == "__main__":
    sys.exit(main())
