"""The options of an interleaved run (prompt set, sampling, batch, servers, output) and what they
make: the run's `RunSettings` and MT-Bench's turn-1 answers."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import datasets, mtbench_answers
from eval.cli_options import BadInput
from eval.run_settings import RunSettings
from eval.sampling import Sampling

RESULTS = Path("eval/results")
LOGS = Path("eval/logs")
QUICK_PROMPTS, QUICK_TOKENS = 3, 32


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated option value ("a, b,,c": a, b and c)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def target_and_draft_cpus(a: argparse.Namespace) -> tuple[int, int]:
    """`--cpus` as (target CPU, draft CPU).

    Raises:
        BadInput: unless exactly two CPUs were given.
    """
    if len(a.cpus) != 2:
        raise BadInput(f"--cpus needs exactly two CPUs (target, draft), got {list(a.cpus)}")
    return a.cpus[0], a.cpus[1]


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options every interleaved run takes (`baseline`, `ssd`, `eagle3`, `mixed`, `run`)."""
    p.add_argument(
        "--dataset",
        choices=datasets.CHOICES,
        default=datasets.HUMANEVAL,
        help="prompt set (default %(default)s)",
    )
    p.add_argument(
        "--prompts", type=int, default=10, help="first N prompts of the set (default %(default)s)"
    )
    p.add_argument(
        "--prompt-ids", nargs="+", default=(), metavar="ID", help="explicit prompt ids instead"
    )
    p.add_argument(
        "--mtbench-turn",
        type=int,
        choices=(1, 2),
        default=1,
        help="MT-Bench's first turns, or its second turns after an answer to the first "
        "(default %(default)s)",
    )
    p.add_argument(
        "--mtbench-answers",
        type=Path,
        help="turn-1 answers for --mtbench-turn 2 (default eval/data/mtbench-turn1-<target "
        "folder>.json; `python -m eval.mtbench_answers` writes them)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="(default %(default)s)")
    p.add_argument(
        "--batch-size", type=int, default=1, help="concurrent requests (default %(default)s)"
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default %(default)s)"
    )
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed for temperature > 0")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stream", action="store_true", help="stream, to record time to first token")
    p.add_argument("--no-flush-cache", action="store_true", help="keep the radix cache")
    p.add_argument(
        "--servers",
        choices=("auto", "concurrent", "sequential"),
        default="auto",
        help="keep all servers alive together, or start them one at a time",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        metavar="FRACTION",
        help="before each unit, wait until at most FRACTION of all CPUs is busy",
    )
    p.add_argument(
        "--quiet-max-wait",
        type=float,
        default=600.0,
        help="seconds to wait for quiet before measuring anyway",
    )
    p.add_argument("--tokenizer", type=Path, help="model folder for the chat template")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_PROMPTS} prompts x {QUICK_TOKENS} tokens, a smoke run",
    )
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the batches of an interrupted run in --out and run only the missing ones",
    )
    p.add_argument("--log-dir", type=Path, help=f"server logs (default {LOGS}/<out name>)")


def settings_of(a: argparse.Namespace) -> RunSettings:
    """The `RunSettings` that `add_run_options`' values make."""
    sampling = Sampling(
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        seed=a.seed if a.temperature > 0 else None,
        ignore_eos=a.ignore_eos,
    )
    concurrent = {"auto": None, "concurrent": True, "sequential": False}[a.servers]
    return RunSettings(
        sampling=sampling,
        batch_size=a.batch_size,
        repeats=a.repeats,
        flush_cache=not a.no_flush_cache,
        stream=a.stream,
        concurrent_servers=concurrent,
        quiet_threshold=a.wait_quiet,
        quiet_max_wait_s=a.quiet_max_wait,
    )


def mtbench_answers_of(
    a: argparse.Namespace, tokenizer_dir: Path
) -> mtbench_answers.Answers | None:
    """The turn-1 answers that `--mtbench-turn 2` asks for (None for first turns or a run
    without MT-Bench).

    Raises:
        BadInput: `--mtbench-answers` without `--mtbench-turn 2`, a second turn without MT-Bench,
            or an answers file that is missing or wrong (the loader's message).
    """
    if a.mtbench_turn != 2:
        if a.mtbench_answers is not None:
            raise BadInput("--mtbench-answers is read only with --mtbench-turn 2")
        return None
    if datasets.MTBENCH not in datasets.sets_of(a.dataset):
        raise BadInput(f"--mtbench-turn 2 needs MT-Bench prompts; --dataset is {a.dataset}")
    path = a.mtbench_answers or mtbench_answers.default_path(tokenizer_dir)
    try:
        return mtbench_answers.load_answers(path)
    except datasets.DatasetError as exc:
        raise BadInput(str(exc)) from exc
