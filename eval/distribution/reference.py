"""The exact law of a prompt's next `n` tokens, as a partition of all continuations into cells.

`enumerate_cells` walks the tree of continuations with transformers in float32 (softmax in
float64) under SGLang's sampling at default top-k/top-p: p = softmax(logits / T). A prefix whose
probability falls below `prune` becomes one cell holding all its continuations (its probability
is still exact), so the cells partition all sequences of `n` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

PRUNE = 1e-6

# contexts (equal lengths) -> per named law ("target" first), float64 [len(contexts), V]
Conditionals = Callable[[list[list[int]]], dict[str, np.ndarray]]


@dataclass
class Cells:
    """A partition of all `n`-token continuations of one prompt.

    Attributes:
        keys: per cell, a full n-token tuple, or a shorter pruned prefix (all its continuations).
        probs: per named law ("target" first), float64 [num cells], summing to 1.
        n: tokens per continuation.
    """

    keys: list[tuple[int, ...]]
    probs: dict[str, np.ndarray]
    n: int

    def __post_init__(self) -> None:
        self._index = {key: i for i, key in enumerate(self.keys)}

    def index(self, tokens: Sequence[int]) -> int:
        """The cell of one sampled continuation (its first `n` tokens); KeyError if none."""
        tokens = tuple(tokens[: self.n])
        for length in range(1, self.n + 1):
            cell = self._index.get(tokens[:length])
            if cell is not None:
                return cell
        raise KeyError(f"{tokens} is in no cell")

    def counts(self, samples: Sequence[Sequence[int]]) -> np.ndarray:
        """int64 [num cells]: how many of `samples` fall in each cell."""
        counts = np.zeros(len(self.keys), dtype=np.int64)
        for tokens in samples:
            counts[self.index(tokens)] += 1
        return counts


def enumerate_cells(
    conditionals: Conditionals, prompt: Sequence[int], n: int, prune: float = PRUNE
) -> Cells:
    """Exact laws of the next `n` tokens after `prompt`, cell by cell (pruning follows p)."""
    frontier: list[tuple[int, ...]] = [()]
    weights: dict[str, np.ndarray] | None = None
    keys: list[tuple[int, ...]] = []
    probs: dict[str, list[np.ndarray]] = {}
    for depth in range(n):
        laws = conditionals([list(prompt) + list(prefix) for prefix in frontier])
        if weights is None:
            weights = {name: np.ones(1) for name in laws}
        joint = {name: weights[name][:, None] * law for name, law in laws.items()}
        vocab = joint["target"].shape[1]
        children = [(*prefix, t) for prefix in frontier for t in range(vocab)]
        flat = {name: j.reshape(-1) for name, j in joint.items()}
        stop = np.ones(len(children), dtype=bool)
        if depth < n - 1:
            stop = flat["target"] < prune
        keys += [c for c, s in zip(children, stop, strict=True) if s]
        for name, values in flat.items():
            probs.setdefault(name, []).append(values[stop])
        frontier = [c for c, s in zip(children, stop, strict=True) if not s]
        weights = {name: values[~stop] for name, values in flat.items()}
    return Cells(keys, {name: np.concatenate(v) for name, v in probs.items()}, n)
