"""The head's forward API as items 3 and 5 use it: whole sequences, KV-cache decode, batches."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.eagle3 import KVCache, causal_mask
from sglang_ssd.testing.eagle3_heads import HIDDEN, VOCAB, head_config, random_head

T = 6


@pytest.fixture
def head() -> torch.nn.Module:
    head = random_head(head_config()).eval()
    head.attach_target(torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)))
    return head


def inputs(batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (batch, T), generator=g)
    return ids, torch.randn(batch, T, 3 * HIDDEN, generator=g), torch.arange(T).expand(batch, T)


@torch.no_grad()
def test_sequence_forward_equals_token_by_token_decode(head: torch.nn.Module) -> None:
    """A causal pass over T tokens = T one-token steps, each against the earlier tokens' cache."""
    ids, feats, pos = inputs()
    whole = head(ids, feats, pos)
    past: KVCache | None = None
    for t in range(T):
        step = head(ids[:, t : t + 1], feats[:, t : t + 1], pos[:, t : t + 1], past=past)
        torch.testing.assert_close(step.logits[0, 0], whole.logits[0, t], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step.hidden[0, 0], whole.hidden[0, t], atol=1e-4, rtol=1e-4)
        past = step.kv if past is None else past.extend(step.kv)
    torch.testing.assert_close(past.key, whole.kv.key, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_explicit_causal_mask_is_the_default(head: torch.nn.Module) -> None:
    ids, feats, pos = inputs()
    default = head(ids, feats, pos).logits
    explicit = head(ids, feats, pos, mask=causal_mask(T)[None]).logits
    full = head(ids, feats, pos, mask=torch.ones(1, T, T, dtype=torch.bool)).logits
    assert torch.equal(default, explicit)
    assert not torch.allclose(default[0, 0], full[0, 0])  # the mask is applied


@torch.no_grad()
def test_batch_rows_are_independent(head: torch.nn.Module) -> None:
    ids, feats, pos = inputs(batch=3)
    batched = head(ids, feats, pos).logits
    for row in range(3):
        alone = head(ids[row : row + 1], feats[row : row + 1], pos[row : row + 1]).logits
        torch.testing.assert_close(batched[row], alone[0], atol=1e-4, rtol=1e-4)


def test_draft_ids_map_to_target_ids(head: torch.nn.Module) -> None:
    ids = head.target_token_ids()
    assert ids.shape == (100,)
    assert torch.equal(ids, torch.arange(100) + head.d2t)


def test_wrong_inputs_are_refused() -> None:
    head = random_head(head_config())
    ids, feats, pos = inputs()
    with pytest.raises(ValueError, match="attach_target"):
        head(ids, feats, pos)
    with pytest.raises(ValueError, match="embed_tokens"):
        head.attach_target(torch.zeros(VOCAB, HIDDEN + 1))
    head.attach_target(torch.zeros(VOCAB, HIDDEN))
    with pytest.raises(ValueError, match="hidden width 100"):
        head(ids, torch.zeros(1, T, 100), pos)
    full = random_head(head_config(draft_vocab_size=None))
    with pytest.raises(ValueError, match="lm_head"):
        full.attach_target(torch.zeros(VOCAB, HIDDEN))
