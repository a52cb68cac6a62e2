"""A seeded, procedurally generated text corpus for training the tiny test pair.

Python-like code and short English sentences built from fixed word lists with Python's own
`random.Random(seed)`, so the text is identical on every machine and Python version (no file
from the standard library or the network, whose content would drift). Every character is
printable ASCII, so the tiny models' character tokenizer covers it.
"""

from __future__ import annotations

import random

LINE_BREAK = "~"


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_NAMES = _words(
    "total count items value index result buffer score limit offset width height name "
    "prefix suffix left right node parent child weight token batch scale delta"
)
_FUNCS = _words(
    "compute merge split update reverse flatten normalize encode decode parse render "
    "filter collect search insert remove"
)
_OPS = ("+", "-", "*", "//", "%")
_WORDS = _words(
    "the a small large quick model draft target token round cache branch verify accept "
    "reject sample output input fast slow every each first last next of to in on with "
    "and or but when while because returns holds keeps reads writes"
)


def _expr(rng: random.Random, names: list[str]) -> str:
    a, b = rng.choice(names), rng.choice(names)
    if rng.random() < 0.3:
        return f"{a} {rng.choice(_OPS)} {rng.randint(1, 9)}"
    return f"{a} {rng.choice(_OPS)} {b}"


def _function(rng: random.Random) -> str:
    args = rng.sample(_NAMES, rng.randint(1, 3))
    lines = [f"def {rng.choice(_FUNCS)}_{rng.choice(_NAMES)}({', '.join(args)}):"]
    local = list(args)
    for _ in range(rng.randint(2, 5)):
        kind = rng.random()
        target = rng.choice(_NAMES)
        if kind < 0.5:
            lines.append(f"    {target} = {_expr(rng, local)}")
            local.append(target)
        elif kind < 0.75:
            lines.append(f"    for {target} in range({rng.choice(local)}):")
            lines.append(f"        {rng.choice(local)} += {target}")
        else:
            lines.append(f"    if {rng.choice(local)} > {rng.randint(0, 9)}:")
            lines.append(f"        return {_expr(rng, local)}")
    lines.append(f"    return {rng.choice(local)}")
    return "\n".join(lines) + "\n"


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 12))]
    return " ".join(words).capitalize() + ".\n"


def tiny_corpus(num_chars: int = 60_000, seed: int = 0) -> str:
    """About `num_chars` characters of code and prose (deterministic for a seed).

    Returns:
        The text, printable ASCII only: line breaks are written as `LINE_BREAK` (the tiny
        tokenizer has no newline token; an unknown character would become end-of-text).
    """
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < num_chars:
        part = _function(rng) if rng.random() < 0.7 else _sentence(rng)
        parts.append(part)
        size += len(part)
    return "\n".join(parts).replace("\n", LINE_BREAK)
