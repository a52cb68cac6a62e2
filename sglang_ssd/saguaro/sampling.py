"""Per-request sampling parameters, the target distribution p and Saguaro's draft distribution.

`apply_sampling` turns logits into the distribution SGLang's sampler draws from (pinned 0.5.23,
sglang/srt/layers/sampler.py `Sampler._sample_from_probs`): divide by the temperature, softmax,
then filter in the order of the server's `--sampling-backend` (`SamplingBatch.filter_order`):
- "joint" (the "pytorch" backend, SGLang's default where FlashInfer is missing, e.g. every CPU;
  `top_k_top_p_min_p_sampling_from_probs_torch`; and "flashinfer" for a batch without min-p,
  `top_k_top_p_sampling_from_probs(filter_apply_order="joint")`): sort descending, zero ranks
  >= top_k, zero tokens whose exclusive cumulative probability exceeds top_p (both on the
  original probabilities), optionally zero tokens below min_p times the top probability;
- "sequential" ("flashinfer" and "intel_xpu" for a batch where any request has min_p > 0, the
  default on CUDA: `top_k_renorm_prob`, then `top_p_renorm_prob`, then
  `min_p_sampling_from_probs`): each filter on the renormalised result of the one before;
and renormalise (SGLang's `torch.multinomial` renormalises implicitly). The two differ: p = [0.4,
0.3, 0.2, 0.1] with top_k 2, top_p 0.5 keeps tokens 0 and 1 jointly (exclusive mass 0.4 <= 0.5)
but only token 0 in sequence (0.3 / 0.7 renormalised follows 0.571 > 0.5). Greedy rows become a
one-hot at `argmax(logits)`, as SGLang's greedy path picks `torch.argmax(logits, -1)`.
docs/design.md#options-that-change-p: the target's p must be the distribution autoregressive
decoding samples from.

`saguaro_probs` is Saguaro sampling (paper Definition 14): the same distribution with the top M
tokens down-weighted by beta, sigma(z)_t proportional to beta * exp(z_t) for t among the top M
and exp(z_t) otherwise. With M_j = F_j + 1 for draft token d_{j+1}: if d_{j+1} is rejected
(k = j) the bonus comes from the residual max(p - sigma, 0), which this pushes onto the top tokens
the fork caches (the top F_j + 1 minus d_{j+1}). The same sigma is the q that `verify` must
receive (docs/design.md#options-that-change-p).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass
from typing import Literal

import torch

from .host_copies import to_device

# SGLang's `_SAMPLING_EPS` (sampling_params.py): a temperature below it means greedy.
GREEDY_TEMPERATURE_EPS = 1e-6
# SGLang's `TOP_K_ALL`: "the whole vocabulary"; -1 is accepted as an alias.
TOP_K_ALL = 1 << 30

FilterOrder = Literal["joint", "sequential"]
FILTER_ORDERS: tuple[FilterOrder, ...] = ("joint", "sequential")
# `--sampling-backend`s that filter a min-p batch in sequence (sampler.py `_sample_from_probs`).
SEQUENTIAL_MIN_P_BACKENDS = ("flashinfer", "intel_xpu")


def filter_order(sampling_backend: str, needs_min_p: bool) -> FilterOrder:
    """The order in which SGLang's `sampling_backend` applies top-k, top-p and min-p to a batch
    (`needs_min_p`: SGLang's batch-wide `need_min_p_sampling`, any request with min_p > 0).

    Source: sglang/srt/layers/sampler.py (0.5.23) `Sampler._sample_from_probs`.
    """
    if needs_min_p and sampling_backend in SEQUENTIAL_MIN_P_BACKENDS:
        return "sequential"
    return "joint"


@dataclass(frozen=True)
class SamplingBatch:
    """Per-request sampling parameters of one batch (SGLang's `SamplingBatchInfo` subset).

    Attributes:
        temperature: float [B], >= 0; below 1e-6 means greedy (SGLang's `_SAMPLING_EPS`).
        top_k: int [B]; 1 means greedy, -1 or any value >= V means the whole vocabulary.
        top_p: float [B] in (0, 1]; 1 disables nucleus filtering.
        min_p: float [B] in [0, 1] or None (no min-p filtering).
        filter_order: how top-k, top-p and min-p combine (module docstring; `filter_order()`
            gives the server's): "joint" or "sequential".

    Greedy (docs/design.md#greedy-requests): `top_k == 1` or `temperature == 0`; SGLang itself
    stores greedy
    as temperature 1, top_k 1. All tensors live on one device; `apply_sampling` moves them to the
    logits' device. Options SGLang applies to the logits before this step (penalties, logit bias,
    grammar masks) are not carried here: callers apply them to the logits first.

    Raises:
        ValueError: on wrong shapes, dtypes or out-of-range values.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor | None = None
    filter_order: FilterOrder = "joint"
    # True for a batch derived from a checked one (`to`, `select`): its values are not read
    # again (on a GPU each check is a device-to-host copy).
    checked: InitVar[bool] = False

    def __post_init__(self, checked: bool) -> None:
        if self.filter_order not in FILTER_ORDERS:
            raise ValueError(
                f"SamplingBatch.filter_order must be one of {FILTER_ORDERS}, "
                f"got {self.filter_order!r}"
            )
        fields = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        if self.min_p is not None:
            fields["min_p"] = self.min_p
        for name, value in fields.items():
            if not isinstance(value, torch.Tensor) or value.dim() != 1:
                raise ValueError(f"SamplingBatch.{name} must be a 1-D tensor [B], got {value!r}")
        sizes = {value.shape[0] for value in fields.values()}
        if len(sizes) != 1:
            raise ValueError(f"SamplingBatch fields disagree on the batch size: {sorted(sizes)}")
        if self.top_k.dtype.is_floating_point or self.top_k.dtype == torch.bool:
            raise ValueError(
                f"SamplingBatch.top_k must be an integer tensor, got {self.top_k.dtype}"
            )
        for name in ("temperature", "top_p", "min_p"):
            value = fields.get(name)
            if value is not None and not value.dtype.is_floating_point:
                raise ValueError(f"SamplingBatch.{name} must be a float tensor, got {value.dtype}")
        if self.batch_size == 0 or checked:
            return
        if not bool(torch.isfinite(self.temperature).all()) or bool((self.temperature < 0).any()):
            raise ValueError("SamplingBatch.temperature must be finite and >= 0")
        if bool(((self.top_k < 1) & (self.top_k != -1)).any()):
            raise ValueError("SamplingBatch.top_k must be >= 1 or -1 (whole vocabulary)")
        if bool(((self.top_p <= 0) | (self.top_p > 1)).any()):
            raise ValueError("SamplingBatch.top_p must be in (0, 1]")
        if self.min_p is not None and bool(((self.min_p < 0) | (self.min_p > 1)).any()):
            raise ValueError("SamplingBatch.min_p must be in [0, 1]")

    @classmethod
    def from_lists(
        cls,
        temperature: list[float],
        top_k: list[int] | None = None,
        top_p: list[float] | None = None,
        min_p: list[float] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """Build a batch from Python lists; omitted top_k / top_p mean 'whole vocabulary' / 1.0."""
        batch = len(temperature)
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k if top_k is not None else [-1] * batch, device=device),
            top_p=torch.tensor(
                top_p if top_p is not None else [1.0] * batch, dtype=torch.float32, device=device
            ),
            min_p=None
            if min_p is None
            else torch.tensor(min_p, dtype=torch.float32, device=device),
        )

    @classmethod
    def uniform(
        cls,
        batch_size: int,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """A batch whose B requests all share the same parameters."""
        return cls(
            temperature=torch.full((batch_size,), temperature, dtype=torch.float32, device=device),
            top_k=torch.full((batch_size,), top_k, dtype=torch.int64, device=device),
            top_p=torch.full((batch_size,), top_p, dtype=torch.float32, device=device),
        )

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    @property
    def is_greedy(self) -> torch.Tensor:
        """bool [B]: `top_k == 1` or `temperature < 1e-6` (docs/design.md#greedy-requests)."""
        return (self.top_k == 1) | (self.temperature < GREEDY_TEMPERATURE_EPS)

    def to(self, device: torch.device | str) -> SamplingBatch:
        """The same parameters on `device` (self if already there)."""
        if self.temperature.device == torch.device(device):
            return self
        return SamplingBatch(
            self.temperature.to(device),
            self.top_k.to(device),
            self.top_p.to(device),
            None if self.min_p is None else self.min_p.to(device),
            self.filter_order,
            checked=True,
        )

    def select(self, index: torch.Tensor) -> SamplingBatch:
        """Rows `index` (int64 [N], bool [B] or a slice) of the batch."""
        if isinstance(index, slice) and index == slice(None):
            return self
        return SamplingBatch(
            self.temperature[index],
            self.top_k[index],
            self.top_p[index],
            None if self.min_p is None else self.min_p[index],
            self.filter_order,
            checked=True,
        )


def apply_sampling(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
    """The distribution SGLang's sampler draws from, for every row of `logits`.

    Args:
        logits: float [B, ..., V]; row b uses the parameters of request b for all its positions.
        sampling: per-request parameters, batch size B.

    Returns:
        probs: [B, ..., V], float32 (float64 if `logits` is float64), rows sum to 1. Greedy rows
        are one-hot at `argmax(logits)`. Rows with top_k >= V, top_p == 1 and min_p == 0 are the
        plain tempered softmax: unlike SGLang's batched path, a row's result never depends on the
        other rows (SGLang filters every row once any row needs it, where a float32 cumsum
        rounding above 1.0 can drop a few ~1e-7 tail tokens of a top_p = 1 row).

    Raises:
        ValueError: if `logits` is not floating point with >= 2 dims or B disagrees.

    Source: sglang/srt/layers/sampler.py (0.5.23) `Sampler.forward` standard path,
    `_sample_from_probs` and `top_k_top_p_min_p_sampling_from_probs_torch`;
    docs/design.md#options-that-change-p.
    """
    if not logits.dtype.is_floating_point or logits.dim() < 2:
        raise ValueError(
            f"logits must be a float tensor [B, ..., V], got {logits.dtype} {tuple(logits.shape)}"
        )
    if logits.shape[0] != sampling.batch_size:
        raise ValueError(f"logits batch {logits.shape[0]} != sampling batch {sampling.batch_size}")
    vocab = logits.shape[-1]
    work_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    rows = logits.reshape(-1, vocab).to(work_dtype)
    per_row = rows.shape[0] // max(sampling.batch_size, 1)

    def expand(value: torch.Tensor) -> torch.Tensor:
        return value.repeat_interleave(per_row)

    # Which rows are greedy, tempered or filtered is read where `sampling` lives (the host, when
    # the caller keeps it there: no device sync); only the per-row tensors go to the logits.
    greedy_here = expand(sampling.is_greedy)
    if bool(greedy_here.all()):
        one_hot = torch.zeros_like(rows).scatter_(1, rows.argmax(dim=-1, keepdim=True), 1.0)
        return one_hot.reshape(logits.shape)
    temperature = expand(sampling.temperature).to(work_dtype)
    temperature = torch.where(greedy_here, torch.ones_like(temperature), temperature)
    tempered = bool((temperature != 1.0).any())
    top_k = expand(sampling.top_k).to(torch.int64)
    top_k = torch.where((top_k < 0) | (top_k > vocab), torch.full_like(top_k, vocab), top_k)
    top_p = expand(sampling.top_p).to(work_dtype)
    min_p = None if sampling.min_p is None else expand(sampling.min_p).to(work_dtype)
    needs_filter = (top_k < vocab) | (top_p < 1.0)
    if min_p is not None:
        needs_filter |= min_p > 0
    needs_filter &= ~greedy_here
    filtered = needs_filter.nonzero().squeeze(1)
    any_greedy = bool(greedy_here.any())

    device = rows.device
    greedy = to_device(greedy_here, device)
    temperature, top_k = to_device(temperature, device), to_device(top_k, device)
    top_p, filtered = to_device(top_p, device), to_device(filtered, device)
    min_p = None if min_p is None else to_device(min_p, device)
    scaled = rows / temperature.unsqueeze(1) if tempered else rows
    probs = torch.softmax(scaled, dim=-1)

    filter_rows = _FILTERS[sampling.filter_order]
    if filtered.numel() == probs.shape[0]:
        probs = filter_rows(probs, top_k, top_p, min_p)
    elif filtered.numel() > 0:
        probs[filtered] = filter_rows(
            probs[filtered],
            top_k[filtered],
            top_p[filtered],
            None if min_p is None else min_p[filtered],
        )

    if any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, rows.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return probs.reshape(logits.shape)


def saguaro_probs(
    draft_logits: torch.Tensor,
    top_m: int | Sequence[int] | torch.Tensor,
    beta: float,
    sampling: SamplingBatch,
) -> torch.Tensor:
    """The Saguaro draft distribution sigma for every row of `draft_logits`.

    Args:
        draft_logits: float [B, V] or [B, D, V] (any [B, ..., V]); row b uses request b's
            sampling parameters.
        top_m: M, how many of the most probable tokens (after temperature/top-k/top-p) are scaled
            by beta: an int, or ints broadcast right-aligned against `draft_logits.shape[:-1]`:
            [B] per request for [B, V] input; [D] per depth, [B, 1] per request or [B, D] for
            [B, D, V] input. M = 0 leaves a row unchanged; M >= V scales every token, which
            renormalises back to p. Use `top_m_from_fanout` for M_j = F_j + 1.
        beta: float in (0, 1]. beta == 1 returns `apply_sampling(draft_logits, sampling)` exactly.
        sampling: the draft's sampling parameters (those of the requests), batch size B.

    Returns:
        probs: float32 [B, ..., V] (float64 for float64 logits), rows sum to 1. Greedy rows are
        returned as `apply_sampling` gives them, i.e. one-hot at argmax(logits), unscaled:
        Saguaro sampling never applies to greedy requests. Tokens filtered out by top-k/top-p
        have probability 0 and stay 0. Ties at the M-th rank are broken by `torch.topk`;
        whichever tokens it picks, the returned tensor is the distribution to sample from and to
        pass to `verify` as q.

    Raises:
        ValueError: if beta is outside (0, 1], top_m is negative or does not broadcast.

    Source: paper Definition 14; docs/design.md#saguaro-sampling-definition-14.
    """
    beta = float(beta)
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta}")
    probs = apply_sampling(draft_logits, sampling)
    if beta == 1.0:
        return probs
    vocab = probs.shape[-1]
    lead_shape = probs.shape[:-1]
    m = torch.as_tensor(top_m, dtype=torch.int64, device=probs.device)
    if m.dim() > len(lead_shape):
        raise ValueError(f"top_m shape {tuple(m.shape)} has more dims than {tuple(lead_shape)}")
    if m.numel() > 0 and bool((m < 0).any()):
        raise ValueError("top_m must be >= 0")
    try:
        m = torch.broadcast_to(m, lead_shape)
    except RuntimeError as err:
        raise ValueError(
            f"top_m shape {tuple(m.shape)} does not broadcast to {tuple(lead_shape)}"
        ) from err
    m = m.clamp(max=vocab)
    max_m = int(m.max()) if m.numel() > 0 else 0
    if max_m == 0:
        return probs
    top_idx = torch.topk(probs, k=max_m, dim=-1, sorted=True).indices  # [..., max_m]
    rank = torch.arange(max_m, device=probs.device)
    in_top = rank < m.unsqueeze(-1)
    scale = torch.where(in_top, beta, 1.0).to(probs.dtype)
    factor = torch.ones_like(probs).scatter_(-1, top_idx, scale)
    scaled = probs * factor
    scaled = scaled / scaled.sum(dim=-1, keepdim=True)
    greedy = sampling.to(probs.device).is_greedy.view(-1, *([1] * (probs.dim() - 1)))
    return torch.where(greedy, probs, scaled)


def top_m_from_fanout(fanout: Sequence[int]) -> list[int]:
    """M_j = F_j + 1 for draft tokens d_{j+1}, j = 0..gamma-1
    (docs/design.md#saguaro-sampling-definition-14).

    Args:
        fanout: F_0..F_gamma (length gamma + 1), e.g. from `geometric_fanout`.

    Returns:
        [F_0 + 1, ..., F_{gamma-1} + 1], length gamma: F_gamma (all accepted, bonus from p) has no
        Saguaro counterpart.

    Raises:
        ValueError: if `fanout` is empty or has a negative entry.
    """
    fanout = [int(f) for f in fanout]
    if not fanout or min(fanout) < 0:
        raise ValueError(f"fanout must be a non-empty list of ints >= 0, got {fanout}")
    return [f + 1 for f in fanout[:-1]]


def _filter_rows(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor | None
) -> torch.Tensor:
    """SGLang's top-k / top-p / min-p masking on probs [N, V], renormalised; same op order.

    Only a sorted prefix is needed: ranks >= top_k are zeroed, and so is every rank after the
    first one whose inclusive cumsum exceeds top_p. So rows are tried on the top ranks first
    (`torch.topk`, as SGLang does with max_top_k), widening through `_PREFIXES`, and only rows
    whose nucleus is wider than all of them get a full sort (SGLang's path for every row).
    """
    vocab = probs.shape[-1]
    max_top_k = int(top_k.max())
    widths = [max_top_k] if max_top_k < vocab else [w for w in _PREFIXES if w < vocab]
    out = torch.zeros_like(probs)
    pending = torch.arange(probs.shape[0], device=probs.device)
    for width in [*widths, vocab]:
        if pending.numel() == 0:
            break
        every = pending.numel() == probs.shape[0]
        rows = probs if every else probs[pending]
        sub_min_p = None if min_p is None else min_p[pending]
        if width < vocab:
            values, index = torch.topk(rows, k=width, dim=-1, sorted=True)
        else:
            values, index = rows.sort(dim=-1, descending=True)
        values, closed = _mask_sorted(values, top_k[pending], top_p[pending], sub_min_p, vocab)
        values = torch.where(closed.unsqueeze(1), values, 0.0)
        if every:
            out.scatter_(1, index, values)
        else:
            out[pending] = torch.zeros_like(rows).scatter_(1, index, values)
        pending = pending[~closed]
    return out


# Sorted-prefix widths tried before a full sort: topk(16384) costs ~1/5 of sorting 151,936.
_PREFIXES = (1024, 16384)


def _mask_sorted(
    probs_sort: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask the sorted leading ranks [N, W] of [N, V] rows in place and renormalise them.

    Returns the normalised values and bool [N]: rows for which every rank >= W is zeroed as
    well (W = V; or by top_k; or by top_p: a later rank's exclusive cumsum is at least this
    prefix's total), i.e. rows that the prefix alone gives exactly.
    """
    width = probs_sort.shape[-1]
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    closed = (top_k <= width) | (probs_sum[:, -1] > top_p) | (width >= vocab)
    ranks = torch.arange(width, device=probs_sort.device).view(1, -1)
    probs_sort[ranks >= top_k.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_p.view(-1, 1)] = 0.0
    if min_p is not None:
        threshold = probs_sort[:, 0] * min_p
        probs_sort[probs_sort < threshold.view(-1, 1)] = 0.0
    return probs_sort / probs_sort.sum(dim=-1, keepdim=True), closed


def _filter_rows_in_sequence(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor | None
) -> torch.Tensor:
    """The "sequential" order on probs [N, V]: top-k, renormalise; top-p on that, renormalise;
    min-p on that, renormalise.

    Top-p keeps the shortest sorted prefix whose mass reaches top_p (a rank is kept while the
    mass before it is below top_p), as FlashInfer's `top_p_renorm_prob` keeps the tokens at or
    above the threshold whose mass is top_p; min-p drops tokens below min_p times the largest.
    Ties at a threshold (a measure-zero event for real logits) are not modelled.

    Source: sglang/srt/layers/sampler.py (0.5.23) `_sample_from_probs`, the flashinfer branch
    with `need_min_p_sampling`; FlashInfer `sampling.py` docstrings of the three functions.
    """
    values, index = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(values.shape[-1], device=values.device).view(1, -1)
    values = torch.where(ranks < top_k.view(-1, 1), values, 0.0)
    values = values / values.sum(dim=-1, keepdim=True)
    before = torch.cumsum(values, dim=-1) - values
    keep = (before < top_p.view(-1, 1)) | (top_p.view(-1, 1) >= 1.0)  # 1: the whole mass
    values = torch.where(keep, values, 0.0)
    values = values / values.sum(dim=-1, keepdim=True)
    if min_p is not None:
        values = torch.where(values >= values[:, :1] * min_p.view(-1, 1), values, 0.0)
        values = values / values.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, index, values)


_FILTERS = {"joint": _filter_rows, "sequential": _filter_rows_in_sequence}
