"""`HeadDraftModel`: an EAGLE-3 head over the paged KV pool equals the head's own forward.

The reference is `Eagle3Head.forward` with an explicit KV cache (itself equal to SGLang's
`LlamaForCausalLMEagle3`, `tests/eagle3/test_eagle3_sglang_parity.py`), in SGLang's alignment:
head row t reads (token x_{t+1}, feature f_t). The paged runtime feeds x_i at position i with
its predecessor's hidden, so its row i must give the reference's row i − 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.eagle3 import Eagle3Head
from sglang_ssd.speculator.head_model import HeadDraftModel, HeadInputs
from sglang_ssd.speculator.kv_pool import KVPool
from sglang_ssd.speculator.packing import causal_segment, pack, tree_segment
from sglang_ssd.testing.eagle3_heads import HIDDEN, VOCAB, head_config, random_head

T = 7
FEATURES = 3 * HIDDEN
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture
def head() -> Eagle3Head:
    head = random_head(head_config()).eval()
    head.attach_target(torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)))
    return head


@pytest.fixture
def model(head: Eagle3Head) -> HeadDraftModel:
    c = head.config
    return HeadDraftModel(head, KVPool(1, 256, c.num_key_value_heads, c.head_dim, torch.float32))


def sequence() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, VOCAB, (T,), generator=g), torch.randn(T, FEATURES, generator=g)


def target_logits(head: Eagle3Head, draft_logits: torch.Tensor) -> torch.Tensor:
    """The reference's draft-vocabulary logits [..., rows] laid out over the target's V."""
    full = torch.full((*draft_logits.shape[:-1], VOCAB), float("-inf"))
    return full.index_copy_(-1, head.target_token_ids(), draft_logits)


def prefill(model: HeadDraftModel, ids: torch.Tensor, feats: torch.Tensor) -> tuple:
    """Feed x_0..x_{T-1} with every feature known, in one forward; (slots, logits [T, V])."""
    slots = model.kv_pool.alloc(T)
    packed = pack([causal_segment(torch.empty(0, dtype=torch.int64), ids, 0, slots)])
    inputs = HeadInputs(packed.head_inputs.prev_slots, feats, torch.ones(T, dtype=torch.bool))
    args = (packed.input_ids, packed.positions, packed.out_slots, packed.layout)
    return slots, model.forward(*args, head_inputs=inputs)


@torch.no_grad()
def test_prefill_equals_the_heads_forward(head: Eagle3Head, model: HeadDraftModel) -> None:
    """Rows 1..T-1 = the reference's rows 0..T-2; row 0 (no feature before it) is invisible."""
    ids, feats = sequence()
    ref = head(ids[None, 1:], feats[None, :-1], torch.arange(T - 1)[None])
    _, logits = prefill(model, ids, feats)
    torch.testing.assert_close(logits[1:], target_logits(head, ref.logits[0]).float(), **TOL)
    other = ids.clone()
    other[0] = (ids[0] + 1) % VOCAB  # the dead row's token changes nothing after it
    _, again = prefill(model, other, feats)
    torch.testing.assert_close(again[1:], logits[1:], **TOL)


@torch.no_grad()
def test_branches_feed_back_the_heads_own_hidden(head: Eagle3Head, model: HeadDraftModel) -> None:
    """Two branches of two drafted tokens after the prefill each equal the reference chain:
    the first reads the last prefilled row's features, the second the head's fed-back hidden,
    and neither branch sees the other."""
    ids, feats = sequence()
    slots, _ = prefill(model, ids, feats)
    ref = head(ids[None, 1:], feats[None, :-1], torch.arange(T - 1)[None])
    firsts, seconds = torch.tensor([5, 9]), torch.tensor([17, 33])
    branch = model.kv_pool.alloc(4).view(2, 2)
    lens = torch.full((2,), T)
    got = []
    for depth, tokens in ((1, firsts), (2, seconds)):
        seg = tree_segment(slots, lens, branch[:, :depth], tokens, lens + depth - 1)
        packed = pack([seg])
        args = (packed.input_ids, packed.positions, packed.out_slots, packed.layout)
        got.append(model.forward(*args, head_inputs=HeadInputs(packed.head_inputs.prev_slots)))
    for b in range(2):
        past = ref.kv
        one = head(firsts[None, b : b + 1], feats[None, -1:], torch.tensor([[T - 1]]), past=past)
        past = past.extend(one.kv)
        two = head(seconds[None, b : b + 1], one.hidden, torch.tensor([[T]]), past=past)
        torch.testing.assert_close(got[0][b], target_logits(head, one.logits[0, 0]), **TOL)
        torch.testing.assert_close(got[1][b], target_logits(head, two.logits[0, 0]), **TOL)


def test_a_drafted_predecessor_in_the_same_forward_is_refused(model: HeadDraftModel) -> None:
    """Two drafted tokens in one forward: the second would need the first's output."""
    slots = model.kv_pool.alloc(2)
    packed = pack(
        [causal_segment(torch.empty(0, dtype=torch.int64), torch.tensor([1, 2]), 0, slots)]
    )
    args = (packed.input_ids, packed.positions, packed.out_slots, packed.layout)
    with pytest.raises(ValueError, match="same forward"):
        model.forward(*args, head_inputs=HeadInputs(packed.head_inputs.prev_slots))
    with pytest.raises(ValueError, match="HeadInputs"):
        model.forward(*args)


def test_logits_are_minus_inf_outside_the_heads_vocabulary(
    head: Eagle3Head, model: HeadDraftModel
) -> None:
    ids, feats = sequence()
    _, logits = prefill(model, ids, feats)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head.target_token_ids()] = False
    assert bool(torch.isinf(logits[:, outside]).all())
    assert bool(torch.isfinite(logits[:, ~outside]).all())
    assert model.vocab.ids.tolist() == sorted(head.target_token_ids().tolist())


@torch.no_grad()
def test_load_takes_the_targets_embeddings(tiny_eagle3_head: tuple, tiny_target: Path) -> None:
    """A built head folder + its target folder: the same logits as the head attached to the
    transformers target's own embeddings, over real target features."""
    from transformers import AutoModelForCausalLM

    from sglang_ssd.build.target_pass import target_pass
    from sglang_ssd.eagle3 import load_head

    folder, _ = tiny_eagle3_head
    model = HeadDraftModel.load(folder, tiny_target, dtype=torch.float32, num_slots=64)
    target = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    head = load_head(folder)
    lm = target.get_output_embeddings().weight if head.lm_head is None else None
    head.attach_target(target.get_input_embeddings().weight, lm)
    ids = torch.randint(
        0, head.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5)
    )
    feats, _ = target_pass(target, ids, head.config.aux_layer_ids)
    ref = head(ids[:, 1:], feats[:, :-1], torch.arange(11)[None])
    slots = model.kv_pool.alloc(12)
    packed = pack([causal_segment(torch.empty(0, dtype=torch.int64), ids[0], 0, slots)])
    inputs = HeadInputs(packed.head_inputs.prev_slots, feats[0], torch.ones(12, dtype=torch.bool))
    args = (packed.input_ids, packed.positions, packed.out_slots, packed.layout)
    logits = model.forward(*args, head_inputs=inputs)
    full = torch.full((11, model.vocab_size), float("-inf"))
    full.index_copy_(1, head.target_token_ids(), ref.logits[0])
    torch.testing.assert_close(logits[1:], full, **TOL)
