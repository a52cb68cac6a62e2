"""Mixed traffic: short requests of mixed lengths, stop strings and concurrency.

What a server sees from a real front end, not a benchmark loop: `mixed_workload` draws N requests
(default 40) from HumanEval and MT-Bench prompts, alternating, each with its own
`max_new_tokens` drawn from 1..128 and, for about a third, stop strings, and cuts them into
units of 1..4 requests sent together. The same draw (seeded) goes to every configuration, unit by
unit, in alternating order (ABAB), so slow drift of the machine hits all alike; `--repeats 2`
gives ABAB x 2. Greedy, so SSD must return exactly AR's tokens (the harness reports identity).

`python -m eval mixed` runs AR on both cores against SSD with the launcher's defaults and writes
`eval/results/mixed-traffic.json` (resumable with `--resume`); the summary and `eval ssd`'s
comparison rows give the throughput ratio with its 90% bootstrap interval over requests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from eval import datasets
from eval.bootstrap import ratio_interval, work_by_prompt
from eval.datasets import Prompt
from eval.sampling import Sampling

STOPS = (("\n\n",), ("```",), ("\n",))
AR, SSD = "AR-2c", "SSD-1+1c"  # the configurations `python -m eval mixed` compares


@dataclass(frozen=True)
class MixedShape:
    """The draw: request count, token budgets, concurrency, stop-string share, seed."""

    requests: int = 40
    max_new_tokens: tuple[int, int] = (1, 128)
    concurrency: tuple[int, int] = (1, 4)
    stop_fraction: float = 1 / 3
    seed: int = 0

    def __post_init__(self) -> None:
        low, high = self.max_new_tokens
        c_low, c_high = self.concurrency
        if self.requests < 1 or not 1 <= low <= high or not 1 <= c_low <= c_high:
            raise ValueError(f"invalid mixed-traffic shape {self}")
        if not 0.0 <= self.stop_fraction <= 1.0:
            raise ValueError(f"stop_fraction must be in [0, 1], got {self.stop_fraction}")


def mixed_workload(
    pools: Sequence[Sequence[Prompt]], shape: MixedShape = MixedShape()
) -> tuple[list[Prompt], tuple[int, ...]]:
    """The requests and their unit sizes.

    Args:
        pools: prompt lists to alternate between (e.g. HumanEval's and MT-Bench's); request i
            takes the next prompt of pool i mod len(pools), cycling within the pool.
        shape: what to draw.

    Returns:
        (requests, unit sizes): each request a `Prompt` with its own greedy `Sampling` and an id
        ``mixed/NN/<prompt id>``; the unit sizes (each in `shape.concurrency`) add up to
        `shape.requests`.

    Raises:
        ValueError: with an empty pool list or an empty pool.
    """
    if not pools or not all(pools):
        raise ValueError("mixed_workload needs at least one non-empty prompt pool")
    rng = random.Random(shape.seed)
    out = []
    for i in range(shape.requests):
        pool = pools[i % len(pools)]
        prompt = pool[(i // len(pools)) % len(pool)]
        stop = rng.choice(STOPS) if rng.random() < shape.stop_fraction else ()
        sampling = Sampling.of(0.0, max_new_tokens=rng.randint(*shape.max_new_tokens), stop=stop)
        record = replace(prompt.record, id=f"mixed/{i:02d}/{prompt.id}")
        out.append(Prompt(record, prompt.input_ids, sampling))
    sizes: list[int] = []
    while sum(sizes) < shape.requests:
        sizes.append(min(rng.randint(*shape.concurrency), shape.requests - sum(sizes)))
    return out, tuple(sizes)


def load_mixed(
    tokenizer: object, shape: MixedShape = MixedShape()
) -> tuple[list[Prompt], tuple[int, ...]]:
    """`mixed_workload` over the first prompts of HumanEval and MT-Bench (enough for no repeat
    within `shape.requests`)."""
    per_pool = -(-shape.requests // 2)
    pools = [datasets.load_prompts(d, tokenizer, per_pool) for d in datasets.DATASETS]
    return mixed_workload(pools, shape)


def comparison(results: dict[str, Any], config: str = SSD, reference: str = AR) -> dict[str, Any]:
    """`config`'s throughput over `reference`'s on a finished mixed run (tokens over summed
    unit wall times, repeats pooled), its 90% bootstrap interval over requests, whether greedy
    outputs were identical, and the aim (>= 0.95x AR) with `met` judged on the
    interval's lower end."""
    work = {name: work_by_prompt(results["batches"], name) for name in (config, reference)}
    tokens = {name: sum(t for t, _ in w.values()) for name, w in work.items()}
    seconds = {name: sum(s for _, s in w.values()) for name, w in work.items()}
    ratio = None
    if seconds[config] > 0 and seconds[reference] > 0 and tokens[reference] > 0:
        ratio = (tokens[config] / seconds[config]) / (tokens[reference] / seconds[reference])
    interval = ratio_interval(work[config], work[reference])
    versus = results.get("summary", {}).get("vs_reference", {}).get(config, {})
    return {
        "config": config,
        "reference": reference,
        "tok_per_s": {n: tokens[n] / seconds[n] if seconds[n] else None for n in work},
        "ratio": ratio,
        "interval_90": list(interval) if interval else None,
        "aim": 0.95,
        "met": bool(interval and interval[0] >= 0.95),
        "identical_outputs": versus.get("identical_outputs"),
        "pairs": versus.get("pairs"),
    }


def format_comparison(row: dict[str, Any]) -> str:
    """One line for the terminal."""
    interval = row["interval_90"]
    span = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
    ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "n/a"
    return (
        f"{row['config']} vs {row['reference']} on mixed traffic: {ratio}{span} "
        f"(aim >= {row['aim']}x: {'met' if row['met'] else 'not met'}; identical outputs "
        f"{row['identical_outputs']}/{row['pairs']})"
    )
