"""How the speculator's q rows cross to the target: at the target's vocabulary
width (zeros padded, or empty columns cut), on the device the target verifies on, and a reply
that cannot be used is a `TransportError` (the supervisor's fault path), never an error that
escapes into SGLang's scheduler. "meta" stands in for the target's GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ssd.transport import DraftEntry, Drafts, ReceivedDrafts, TransportError
from sglang_ssd.worker.draft_batch import DraftBatch, dense_q
from sglang_ssd.worker.draft_provider import LocalNgramProvider
from sglang_ssd.worker.drafts_reply import reply_batch

HAS_Q = torch.tensor([True, False, True])


def _q(vocab: int, depth: int = 2) -> torch.Tensor:
    return torch.softmax(torch.randn(2, depth, vocab), dim=-1)


def test_a_narrower_draft_is_padded_with_zeros() -> None:
    q = _q(6)
    out = dense_q(q, HAS_Q, 8, "cpu")
    assert out.shape == (3, 2, 8)
    assert torch.equal(out[0, :, :6], q[0]) and torch.equal(out[2, :, :6], q[1])
    assert bool((out[:, :, 6:] == 0).all()) and bool((out[1] == 0).all())


def test_a_wider_draft_loses_only_empty_columns_and_mass_beyond_is_refused() -> None:
    q = torch.nn.functional.pad(_q(6), (0, 2))  # the speculator cut ids 6, 7 before sampling
    assert torch.equal(dense_q(q, HAS_Q, 6, "cpu")[2], q[1, :, :6])
    q[1, 0, 7] = 1e-3
    with pytest.raises(ValueError, match="mass on ids >= the target's vocabulary"):
        dense_q(q, HAS_Q, 6, "cpu")
    with pytest.raises(ValueError, match="2 rows but 1"):
        dense_q(q, torch.tensor([True, False]), 6, "cpu")


def test_q_lands_on_the_target_device() -> None:
    out = dense_q(_q(8), HAS_Q, 8, "meta")
    assert out.device == torch.device("meta") and out.shape == (3, 2, 8)


def _batch(got: ReceivedDrafts, vocab: int, device: str) -> DraftBatch:
    """The reply as the speculator client turns it into the target's drafts."""
    batch, missing = reply_batch(REQS, got, vocab, torch.device(device), LocalNgramProvider(2))
    assert missing == []
    return batch


def _reply(tokens: torch.Tensor, q: torch.Tensor | None, vocab: int) -> ReceivedDrafts:
    entries = [
        DraftEntry(rid=f"r{i}", source="jit", depth=2, has_q=bool(h)) for i, h in enumerate(HAS_Q)
    ]
    msg = Drafts(step_id=1, entries=entries, max_depth=2, vocab_size=vocab)
    return ReceivedDrafts(msg, tokens, q)


REQS = [SimpleNamespace(rid=f"r{i}") for i in range(3)]


def test_the_client_puts_q_on_the_target_device_and_tokens_on_the_cpu() -> None:
    tokens = torch.tensor([[1, 2], [3, 4], [5, 6]])
    batch = _batch(_reply(tokens, _q(6), 6), 8, "meta")
    assert batch.q is not None and batch.q.device == torch.device("meta")
    assert batch.q.shape == (3, 2, 8) and batch.tokens.device == torch.device("cpu")


@pytest.mark.parametrize("case", ["mass beyond", "token beyond", "depth"])
def test_unusable_drafts_are_transport_errors(case: str) -> None:
    tokens = torch.tensor([[1, 2], [3, 4], [5, 6]])
    q = torch.nn.functional.pad(_q(6), (0, 2))
    if case == "mass beyond":
        q[0, 1, 7] = 0.5
    elif case == "token beyond":
        tokens[1, 1] = 7
    else:
        q = q[:, :1]
    with pytest.raises(TransportError, match="unusable drafts"):
        _batch(_reply(tokens, q, 8), 6, "cpu")


def test_rows_the_speculator_could_not_draft_get_the_targets_own_drafts() -> None:
    """A "missing" row (the speculator does not hold the request) is drafted by the target's
    n-gram drafts, which may be deeper than the reply: every row is widened with -1."""
    reqs = [
        SimpleNamespace(rid=f"m{i}", origin_input_ids=[5, 6, 7, 5, 6, 7, 5], output_ids=[6])
        for i in range(2)
    ]
    entries = [
        DraftEntry(rid="m0", source="jit", depth=2, has_q=False),
        DraftEntry(rid="m1", source="missing", depth=0, has_q=False),
    ]
    msg = Drafts(step_id=1, entries=entries, max_depth=2, vocab_size=8)
    got = ReceivedDrafts(msg, torch.tensor([[1, 2], [-1, -1]]), None)
    local = LocalNgramProvider(4)
    batch, missing = reply_batch(reqs, got, 8, torch.device("cpu"), local)
    expected = local.drafts(reqs[1:])
    assert missing == [1] and batch.sources == ["jit", "local-ngram"]
    assert batch.tokens.tolist()[0] == [1, 2, -1, -1]
    assert torch.equal(batch.tokens[1], expected.tokens[0])
    assert batch.depth.tolist() == [2, int(expected.depth[0])] and batch.q is None


def test_q_sent_at_the_draft_vocabularys_columns_scatters_to_the_full_q() -> None:
    """The speculator sends q only at its draft vocabulary's ids (zero
    elsewhere); the target scatters it back, the same q as the full-width one."""
    columns = torch.tensor([0, 2, 3, 6])
    full = torch.zeros(2, 2, 8)
    full[:, :, columns] = _q(4)
    out = dense_q(full[:, :, columns], HAS_Q, 8, "cpu", columns)
    assert torch.equal(out, dense_q(full, HAS_Q, 8, "cpu"))
    assert torch.equal(out[2], full[1]) and bool((out[1] == 0).all())
    with pytest.raises(ValueError, match="4 columns but 3 column ids"):
        dense_q(full[:, :, columns], HAS_Q, 8, "cpu", columns[:3])


def test_columns_beyond_the_targets_vocabulary_are_cut_when_empty_refused_with_mass() -> None:
    columns = torch.tensor([1, 4, 6, 7])  # a draft vocabulary reaching past a 6-id target
    q = torch.nn.functional.pad(_q(2), (0, 2))
    out = dense_q(q, HAS_Q, 6, "cpu", columns)
    assert out.shape == (3, 2, 6)
    assert torch.equal(out[0][:, [1, 4]], q[0, :, :2]) and float(out[0].sum()) == pytest.approx(2)
    q[0, 0, 3] = 1e-3
    with pytest.raises(ValueError, match="mass on ids >= the target's vocabulary"):
        dense_q(q, HAS_Q, 6, "cpu", columns)


def test_the_client_scatters_q_at_the_columns_the_reply_names() -> None:
    columns = torch.tensor([1, 3, 4, 7])
    entries = [
        DraftEntry(rid=f"r{i}", source="jit", depth=2, has_q=bool(h)) for i, h in enumerate(HAS_Q)
    ]
    msg = Drafts(step_id=1, entries=entries, max_depth=2, vocab_size=8, q_columns=4)
    q = _q(4)
    got = ReceivedDrafts(msg, torch.tensor([[1, 3], [4, 7], [3, 1]]), q, columns)
    batch = _batch(got, 8, "cpu")
    assert batch.q is not None and torch.equal(batch.q[2][:, columns], q[1])
    assert float(batch.q[2].sum()) == pytest.approx(2.0)
