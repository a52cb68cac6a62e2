"""`shape_logits` against SGLang's own penalizers, run as plain decoding would run them.

The reference for verify position j: a fresh `BatchedPenalizerOrchestrator` over the request,
fed the output tokens and then d_1 .. d_j one decoding step at a time (as SGLang's scheduler
feeds it), applied to that position's logits. Additive penalties then scaling
(`apply(repeat=1)`), the order `shape_logits` documents.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.sampling import penaltylib
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_ssd.saguaro.shaping import RequestOptions, prefix_counts, shape_logits

V = 12
W = 5
EOS = 11


class _Batch:
    """What the orchestrator reads of a `ScheduleBatch`: reqs and device (weakly referenced)."""

    def __init__(self, reqs: list) -> None:
        self.reqs = reqs
        self.device = "cpu"


def _req(opt: RequestOptions) -> SimpleNamespace:
    params = SimpleNamespace(
        frequency_penalty=opt.frequency_penalty,
        presence_penalty=opt.presence_penalty,
        repetition_penalty=opt.repetition_penalty,
        min_new_tokens=opt.min_new_tokens,
        stop_token_ids=set(opt.stop_ids),
    )
    tokenizer = SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS)
    return SimpleNamespace(sampling_params=params, eos_token_ids={EOS}, tokenizer=tokenizer)


def _sglang_position(logits: torch.Tensor, opt: RequestOptions, prefix: list[int]) -> torch.Tensor:
    """SGLang's penalties for one decoding step after `prefix` (output tokens) on [V] logits."""
    batch = _Batch([_req(opt)])
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(
        vocab_size=V,
        batch=batch,
        penalizers={
            penaltylib.BatchedFrequencyPenalizer,
            penaltylib.BatchedMinNewTokensPenalizer,
            penaltylib.BatchedPresencePenalizer,
            penaltylib.BatchedRepetitionPenalizer,
        },
    )
    assert weakref.ref(batch)() is batch
    for token in prefix:
        orchestrator.cumulate_output_tokens(torch.tensor([token]))
    out = logits.clone().unsqueeze(0)
    if orchestrator.is_required:
        orchestrator.apply(out, repeat=1)
    if opt.logit_bias:
        for token, bias in opt.logit_bias.items():
            out[0, token] += bias
    return out[0]


def _reference(logits: torch.Tensor, drafts: torch.Tensor, opts: list[RequestOptions]):
    """Expected logits at each row's verified positions 0 .. len(draft); NaN past them."""
    expected = torch.full_like(logits, float("nan"))
    for b, opt in enumerate(opts):
        draft = [t for t in drafts[b].tolist() if t >= 0]
        for j in range(len(draft) + 1):
            prefix = list(opt.output_ids) + draft[:j]
            expected[b, j] = _sglang_position(logits[b, j], opt, prefix)
    return expected


OPTION_SETS = {
    "frequency": dict(frequency_penalty=1.5),
    "presence": dict(presence_penalty=0.7),
    "repetition": dict(repetition_penalty=1.3),
    "additive_and_repetition": dict(
        frequency_penalty=0.4, presence_penalty=-0.3, repetition_penalty=0.8
    ),
    "min_new_tokens": dict(min_new_tokens=5, stop_ids=frozenset({3, EOS})),
    "logit_bias": dict(logit_bias={2: 5.0, 7: -2.5}),
    "everything": dict(
        frequency_penalty=0.5,
        repetition_penalty=1.2,
        min_new_tokens=4,
        stop_ids=frozenset({1, 4, EOS}),
        logit_bias={4: 3.0},
    ),
}


@pytest.mark.parametrize("name", list(OPTION_SETS))
@pytest.mark.parametrize("seed", range(4))
def test_matches_sglang_penalizers_at_every_position(name: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = 3
    logits = 3 * torch.randn(batch, W, V, generator=gen)
    # Few distinct tokens, so drafts repeat output tokens and each other.
    drafts = torch.randint(0, 5, (batch, W - 1), generator=gen)
    drafts[1, 2:] = -1  # a shorter draft
    outputs = [torch.randint(0, 5, (n,), generator=gen).tolist() for n in (0, 2, 6)]
    opts = [RequestOptions(output_ids=out, **OPTION_SETS[name]) for out in outputs]
    expected = _reference(logits, drafts, opts)
    shape_logits(logits, drafts, opts)
    verified = ~expected.isnan()
    assert int(verified.sum()) == (W + W - 2 + W) * V
    torch.testing.assert_close(logits[verified], expected[verified], rtol=1e-6, atol=1e-5)


def test_relaxed_form_differs_where_the_draft_repeats_a_token() -> None:
    """The negative control of the per-position rule: SGLang's speculative form (the round's
    starting counts at every position) differs exactly at positions after a repeated token."""
    logits = torch.zeros(1, W, V)
    drafts = torch.tensor([[2, 2, 5, 6]])
    opts = [RequestOptions(output_ids=[], frequency_penalty=1.0)]
    exact, relaxed = logits.clone(), logits.clone()
    shape_logits(exact, drafts, opts)
    shape_logits(relaxed, drafts, opts, per_position=False)
    assert relaxed[0, :, 2].tolist() == [0.0] * W
    assert exact[0, :, 2].tolist() == [0.0, -1.0, -2.0, -2.0, -2.0]


def test_prefix_counts_count_output_then_draft_prefix() -> None:
    columns, counts = prefix_counts([[1, 1, 3], []], torch.tensor([[3, -1], [4, 4]]), width=3)
    assert columns.tolist() == [[1, 3], [4, 4]]  # the second row repeats its only id
    assert counts[0].tolist() == [[2, 1], [2, 2], [2, 2]]
    assert counts[1].tolist() == [[0, 0], [1, 1], [2, 2]]


class _Allocations(TorchDispatchMode):
    """Shapes of every tensor an op returns (what `shape_logits` allocates, and the views)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_penalties_allocate_nothing_vocabulary_wide() -> None:
    """Penalised rows are shaped at the columns their output and draft hold: no op makes an
    [R, W, V] tensor for the R penalised rows, the result unchanged."""
    vocab = 4096
    logits = torch.randn(3, W, vocab)
    drafts = torch.tensor([[5, 7, 5, -1], [1, 2, 3, 4], [9, 9, 9, 9]])
    opts = [
        RequestOptions(output_ids=[5, 6, 6], frequency_penalty=0.5, repetition_penalty=1.3),
        RequestOptions(output_ids=[1]),
        RequestOptions(output_ids=[2, 9], presence_penalty=0.7),
    ]
    expected = logits.clone()
    for b in (0, 2):
        for j in range(W):
            prefix = [*opts[b].output_ids, *[t for t in drafts[b, :j].tolist() if t >= 0]]
            _reference_penalties(expected[b, j], prefix, opts[b])
    with _Allocations() as seen:
        shape_logits(logits, drafts, opts)
    assert (2, W, vocab) not in seen.shapes, seen.shapes
    torch.testing.assert_close(logits, expected)


def _reference_penalties(z: torch.Tensor, prefix: list[int], opt: RequestOptions) -> None:
    """SGLang's formulas (module docstring) on one position's logits, token by token."""
    for t in set(prefix):
        z[t] -= opt.frequency_penalty * prefix.count(t) + opt.presence_penalty
        z[t] = z[t] * opt.repetition_penalty if z[t] < 0 else z[t] / opt.repetition_penalty


def test_neutral_options_leave_logits_unchanged() -> None:
    logits = torch.randn(2, W, V)
    before = logits.clone()
    opts = [
        RequestOptions(output_ids=[1, 2]),
        RequestOptions(output_ids=[1, 2, 3], min_new_tokens=3, stop_ids=frozenset({1})),
    ]
    assert all(opt.neutral for opt in opts)
    shape_logits(logits, torch.tensor([[1, 1, 1, 1], [2, 2, -1, -1]]), opts)
    assert torch.equal(logits, before)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        shape_logits(torch.zeros(1, 3, V), torch.zeros(1, 3, dtype=torch.int64), [])
