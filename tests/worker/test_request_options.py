"""Request options on a verify forward's logits, with SGLang's own request and grammar objects.

The grammar is a real XGrammar regex grammar over the tiny pair's tokenizer. The mask of each
verify position must be the grammar's mask after the draft prefix, a draft token the grammar
refuses must get p = 0 at its position, and the grammar must be left where it was: the scheduler
then commits the verified run, which must leave it where plain decoding of that run leaves it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
from sglang.srt.sampling.sampling_params import SamplingParams
from transformers import AutoTokenizer

from sglang_ssd.worker.request_options import request_options, shape_verify_logits

REGEX = "(ab|cd)+x"


@pytest.fixture(scope="module")
def tokenizer(tiny_target: Path):
    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def backend(tokenizer) -> XGrammarGrammarBackend:
    return XGrammarGrammarBackend(tokenizer, vocab_size=len(tokenizer))


def _mask_of(grammar, vocab: int) -> torch.Tensor:
    """bool [V]: the tokens `grammar` allows in its current state."""
    bits = grammar.allocate_vocab_mask(vocab_size=vocab, batch_size=1, device="cpu")
    grammar.fill_vocab_mask(bits, 0)
    logits = torch.zeros(1, vocab)
    grammar.apply_vocab_mask(logits=logits, vocab_mask=bits)
    return logits[0] == 0


def _req(params: SamplingParams, output_ids: list[int], grammar=None, tokenizer=None):
    return SimpleNamespace(
        sampling_params=params,
        output_ids=output_ids,
        grammar=grammar,
        tokenizer=tokenizer,
        eos_token_ids={3},
    )


def test_grammar_mask_follows_the_draft_and_leaves_the_grammar_unchanged(
    backend, tokenizer
) -> None:
    vocab = len(tokenizer)
    ids = {c: tokenizer.convert_tokens_to_ids(c) for c in "abcdx"}
    grammar = backend.dispatch_regex(REGEX)
    grammar.accept_token(ids["a"])  # one committed output token: "a"
    before = _mask_of(grammar, vocab)
    # Row 0: "b c d" all allowed; row 1: "b" then "x" (allowed: "abx") then "a" (refused: done).
    drafts = torch.tensor([[ids["b"], ids["c"], ids["d"]], [ids["b"], ids["x"], ids["a"]]])
    verify_ids = torch.cat([torch.full((2, 1), ids["a"]), drafts], dim=1)
    grammars = [grammar, backend.dispatch_regex(REGEX)]
    grammars[1].accept_token(ids["a"])
    reqs = [_req(SamplingParams(), [ids["a"]], g) for g in grammars]
    batch = SimpleNamespace(
        reqs=reqs, has_grammar=True, sampling_info=SimpleNamespace(vocab_size=vocab)
    )
    logits = torch.zeros(2 * 4, vocab)
    shape_verify_logits(batch, logits, verify_ids, drafts)
    allowed = (logits > float("-inf")).view(2, 4, vocab)

    reference = backend.dispatch_regex(REGEX)
    for row, draft in enumerate(drafts.tolist()):
        reference = backend.dispatch_regex(REGEX)
        reference.accept_token(ids["a"])
        for j in range(3):
            assert torch.equal(allowed[row, j], _mask_of(reference, vocab)), (row, j)
            if not allowed[row, j, draft[j]]:
                break  # p(d_{j+1}) = 0: verify rejects it here, later rows never matter
            reference.accept_token(draft[j])
    assert not allowed[1, 2, ids["a"]], "the grammar refuses 'a' after 'abx'"
    assert torch.equal(_mask_of(grammar, vocab), before), "the grammar moved"

    # The scheduler commits a verified run (accept "b", bonus "c"): the grammar is then where
    # plain decoding of "a b c" leaves it.
    for token in (ids["b"], ids["c"]):
        grammar.accept_token(token)
    plain = backend.dispatch_regex(REGEX)
    for token in (ids["a"], ids["b"], ids["c"]):
        plain.accept_token(token)
    assert torch.equal(_mask_of(grammar, vocab), _mask_of(plain, vocab))


def test_stop_set_is_the_min_new_tokens_penalizers(tokenizer) -> None:
    tokenizer.additional_stop_token_ids = {7}
    try:
        params = SamplingParams(min_new_tokens=4, stop_token_ids=[5])
        opt = request_options(_req(params, [1, 2], tokenizer=tokenizer))
    finally:
        del tokenizer.additional_stop_token_ids
    assert opt.stop_ids == {5, 3, 7, tokenizer.eos_token_id}
    assert opt.min_new_tokens == 4 and not opt.neutral
    assert request_options(_req(SamplingParams(), [1])).neutral


def test_penalties_and_bias_are_read_from_sglang_params() -> None:
    params = SamplingParams(
        frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=1.5, logit_bias={"4": 2}
    )
    opt = request_options(_req(params, [4, 4]))
    assert (opt.frequency_penalty, opt.presence_penalty, opt.repetition_penalty) == (
        0.5,
        0.25,
        1.5,
    )
    assert opt.logit_bias == {4: 2.0}
    logits = torch.zeros(2, 8)
    batch = SimpleNamespace(reqs=[_req(params, [4, 4])], has_grammar=False)
    shape_verify_logits(batch, logits, torch.tensor([[4, 4]]), torch.tensor([[4]]))
    # counts of token 4: 2 at position 0, 3 at position 1; additive, then scaled (z < 0), then bias.
    assert logits[:, 4].tolist() == [-1.25 * 1.5 + 2.0, -1.75 * 1.5 + 2.0]
