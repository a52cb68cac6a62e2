"""Per-request state held by the speculator.

Invariant: `slots[i]` holds the draft model's K/V of `sequence[i]` for i < `num_fed`, where
`sequence = committed + draft`. Once a request's prefill is done, after an outcome is applied
every committed token except the last one (the root, i.e. the newest bonus token) is fed; a cache
hit also brings the fed slots of the branch's own tokens. Until then (a prefill fed in chunks, or
held up by a full KV pool) only a prefix is fed: `backlog` tokens before the root are not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ssd.saguaro.sampling import GREEDY_TEMPERATURE_EPS
from sglang_ssd.speculator.target_features import TargetFeatures


def empty_slots(device: torch.device | str) -> torch.Tensor:
    """int64 [0] on `device`: the slots of a request nothing of which is fed yet (the pool's
    device, so that feeding appends the pool's slots to it without a device mismatch)."""
    return torch.empty(0, dtype=torch.int64, device=device)


def generator_device(device: torch.device | str) -> torch.device:
    """Where a draft-sampling generator for logits on `device` must live: `torch.multinomial`
    on CUDA probabilities takes only a generator of that CUDA device, so a CUDA device (with
    its index: the current one when none is given) gets its own; every other device (cpu, and
    meta, which has no generators) samples with a CPU generator."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.device("cpu")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass
class Draft:
    """The draft the speculator sent for the current round.

    Attributes:
        tokens: d_1..d_D.
        q: float32 [D, V], the exact distributions they were sampled from; None for greedy or
            point-mass (n-gram / random) drafts.
        candidates: int64 [D + 1, C] or None: per fork point k (rejection of d_{k+1}, k < D;
            or all accepted, k = D) the draft's most likely bonus tokens, best first, padded
            with -1. Row D is filled by glue decode.
        source: "cache", "jit", "ngram", "random" (or "prefill": the empty first-round draft).
        probs: float32 [D + 1, C] or None: the draft's probability of each of `candidates` (0 at
            padding), filled with them; the outcome model (`saguaro.outcome_model`) reads it.
        token_probs: float32 [D] or None: the draft's probability of each d_j where it was drawn.
    """

    tokens: list[int]
    q: torch.Tensor | None
    candidates: torch.Tensor | None
    source: str
    probs: torch.Tensor | None = None
    token_probs: torch.Tensor | None = None

    @property
    def depth(self) -> int:
        return len(self.tokens)


@dataclass
class Branches:
    """The pre-speculated branches of one request for the current round (owned KV slots).

    Row i belongs to outcome (ks[i], bonus[i]); `slots[i]` holds the K/V of [bonus, e_1 ..
    e_{D-1}]; `candidates[i]` is [D + 1, C] for the next fork, `probs[i]` ([D + 1, C]) the
    draft's probabilities of those candidates and `token_probs[i]` ([D]) of its own tokens.
    """

    ks: list[int]
    bonus: list[int]
    slots: torch.Tensor
    candidates: torch.Tensor
    probs: torch.Tensor | None = None
    token_probs: torch.Tensor | None = None


@dataclass
class RequestState:
    """What the speculator knows about one request.

    Attributes:
        rid: request id (SGLang's rid).
        committed: prompt + generated tokens the target has committed (as reported to us).
        temperature / top_k / top_p: the request's sampling parameters (the draft uses them too).
        generator: the draft's own RNG for this request (independent of the target's).
        slots: int64 [num_fed] on the KV pool's device (`empty_slots`), KV slots of the fed
            prefix of `committed + draft.tokens`; every slot tensor the pool hands out lives
            there, and `torch.cat` refuses to mix devices.
        draft: the outstanding draft, if any.
        branches: this round's pre-speculated branches, if built.
        first_round: pre-speculate the round after prefill once the prefill is done (set at
            open, cleared by the first outcome).
        features: the target's features of committed positions, for a draft that reads them
            (an EAGLE-3 head); None for a plain draft model.
        stale_from: the first fed committed row computed before the target's features of the
            position before it arrived (the head's own hidden stood in); refreshed next.
    """

    rid: str
    committed: list[int]
    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator
    slots: torch.Tensor
    draft: Draft | None = None
    branches: Branches | None = None
    first_round: bool = False
    features: TargetFeatures | None = None
    stale_from: int | None = None

    @property
    def num_fed(self) -> int:
        return int(self.slots.numel())

    @property
    def backlog(self) -> int:
        """Committed tokens before the root that are not fed yet (0 once prefilled)."""
        return max(len(self.committed) - 1 - self.num_fed, 0)

    @property
    def feedable(self) -> int:
        """How much of the backlog can be fed now: all of it, or with `features` the rows whose
        predecessor's features have arrived (row i reads f_{i-1})."""
        if self.features is None:
            return self.backlog
        return min(self.backlog, max(self.features.count + 1 - self.num_fed, 0))

    @property
    def prefilled(self) -> bool:
        """Whether the prefill is done: no backlog, and with `features` the features of every
        committed position before the root (the root's row reads the last of them)."""
        if self.backlog:
            return False
        return self.features is None or self.features.count >= len(self.committed) - 1

    def trim_fed_features(self) -> None:
        """Forget the target features of committed rows already fed: feeding row p wrote
        fc(f_p) into its slot, so f_p is never read again (a refresh recomputes rows from
        features that arrived after they were fed, which are not trimmed)."""
        if self.features is not None:
            self.features.trim(min(self.num_fed, len(self.committed) - 1))

    @property
    def is_greedy(self) -> bool:
        """SGLang's greedy rule: top_k == 1 or temperature ~ 0 (docs/design.md#greedy-requests)."""
        return self.top_k == 1 or self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def sequence(self) -> list[int]:
        """committed + outstanding draft tokens."""
        return self.committed + (self.draft.tokens if self.draft is not None else [])
