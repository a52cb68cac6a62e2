"""DraftModel: prefill, incremental decode and tree decode over the KV pool vs plain HF forwards.

Tiny random-weight Qwen2 models (fp32) are built on the fly; the real converted 0.5B draft is
checked too when its folder exists. Each test runs for the "torch" runtime (float32 here) and for
"torch-int8" (`int8_model`), whose reference is the same HF model with the same int8 layers: its
activations are quantised with one scale per call, so rows agree with their reference to that
precision (`TOLERANCE`), not to float32's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Qwen2Config, Qwen2ForCausalLM

from sglang_ssd.speculator.draft_model import AttentionLayout, DraftModel
from sglang_ssd.speculator.int8_model import Int8DraftModel, quantize_linears
from sglang_ssd.speculator.packing import causal_segment, pack

REAL_DRAFT = Path.home() / ".cache/sglang_ssd/models/qwen2.5-coder-0.5b-instruct"
VOCAB = 128
EMPTY = torch.zeros(0, dtype=torch.int64)
# Per runtime: (atol, rtol) of its logits against its reference.
TOLERANCE = {"torch": (1e-4, 1e-4), "torch-int8": (0.3, 0.0)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and OpenMP threads on a busy 2-core machine spin
    (10x slower); the real-model test stays fast enough on one core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        layer_types=["full_attention"] * 2,
        eos_token_id=[5, 7],
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # larger weights than the init so that attention is far from uniform
        for name, param in model.named_parameters():
            if "proj" in name or "embed" in name:
                param.mul_(4.0)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(TOLERANCE))
def runtime(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def reference(tiny_path, runtime) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        tiny_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return quantize_linears(model) if runtime == "torch-int8" else model


@pytest.fixture
def draft(tiny_path, runtime) -> DraftModel:
    if runtime == "torch":
        return DraftModel.load(tiny_path, dtype=torch.float32, num_slots=512)
    model = Int8DraftModel.load(tiny_path, dtype=torch.float32, num_slots=512)
    model.quantize()
    return model


@pytest.fixture
def close(runtime):
    """`torch.testing.assert_close` at the runtime's tolerance."""
    atol, rtol = TOLERANCE[runtime]

    def check(actual: torch.Tensor, expected: torch.Tensor, msg: str | None = None) -> None:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=msg)

    return check


@torch.no_grad()
def _full_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """float32 [len(tokens), V] from a plain HF forward over the whole sequence."""
    return model(torch.tensor([tokens])).logits[0].float()


def _causal_layout(context: list[torch.Tensor], new: list[torch.Tensor]) -> AttentionLayout:
    """Request r's `new` slots extend its `context` slots causally, as the speculator packs
    prefill and decode (the layout depends on the slots only, so the tokens are placeholders)."""
    segments = [
        causal_segment(c, torch.zeros(n.numel(), dtype=torch.int64), 0, n)
        for c, n in zip(context, new, strict=True)
    ]
    return pack(segments).layout


def _prefill(
    draft: DraftModel, prompts: list[list[int]]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Prefill several requests in one forward; returns per-request slots and all logits."""
    slots = [draft.kv_pool.alloc(len(p)) for p in prompts]
    layout = _causal_layout([EMPTY] * len(prompts), slots)
    logits = draft.forward(
        torch.tensor([t for p in prompts for t in p]),
        torch.cat([torch.arange(len(p)) for p in prompts]),
        torch.cat(slots),
        layout,
    )
    return slots, logits


def test_properties(draft):
    assert draft.vocab_size == VOCAB
    assert draft.num_layers == 2
    assert draft.eos_token_ids == (5, 7)
    assert draft.kv_pool.k[0].shape == (512, 2, 16)


def test_prefill_matches_hf_eager(draft, reference, close):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (13, 1, 7)]
    _, logits = _prefill(draft, prompts)
    expected = torch.cat([_full_logits(reference, p) for p in prompts])
    assert logits.dtype == torch.float32 and logits.shape == (21, VOCAB)
    close(logits, expected)
    assert draft.forward_count == 1


def test_logits_rows_selects_rows(draft, reference, close):
    prompt = list(range(3, 20))
    slots = draft.kv_pool.alloc(len(prompt))
    rows = torch.tensor([16, 0, 5])
    logits = draft.forward(
        torch.tensor(prompt),
        torch.arange(len(prompt)),
        slots,
        _causal_layout([EMPTY], [slots]),
        logits_rows=rows,
    )
    assert logits.shape == (3, VOCAB)
    close(logits, _full_logits(reference, prompt)[rows])


def test_incremental_decode_matches_full_forward(draft, reference, close):
    """Several requests decoded together, one token each per forward, through scattered slots."""
    pool = draft.kv_pool
    scatter = pool.alloc(64)
    pool.free(scatter[::2])  # fragment the free list so that slots are not contiguous
    gen = torch.Generator().manual_seed(2)
    sequences = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (9, 4, 15)]
    slots, _ = _prefill(draft, sequences)
    for step in range(6):
        new_slots = [pool.alloc(1) for _ in sequences]
        tokens = torch.randint(0, VOCAB, (len(sequences),), generator=gen)
        positions = torch.tensor([len(s) for s in sequences])
        logits = draft.forward(
            tokens, positions, torch.cat(new_slots), _causal_layout(slots, new_slots)
        )
        for r, seq in enumerate(sequences):
            seq.append(int(tokens[r]))
            slots[r] = torch.cat([slots[r], new_slots[r]])
            expected = _full_logits(reference, seq)[-1]
            close(logits[r], expected, msg=f"{step=}")
    assert draft.forward_count == 1 + 6


def test_matches_hf_dynamic_cache_decode(draft, reference):
    """Greedy decode through the pool equals HF's own cached greedy decode."""
    prompt = [11, 42, 7, 99, 3, 64, 12]
    slots, logits = _prefill(draft, [prompt])
    ours = [int(logits[-1].argmax())]
    slots = slots[0]
    for _ in range(8):
        new = draft.kv_pool.alloc(1)
        out = draft.forward(
            torch.tensor(ours[-1:]),
            torch.tensor([len(prompt) + len(ours) - 1]),
            new,
            _causal_layout([slots], [new]),
        )
        slots = torch.cat([slots, new])
        ours.append(int(out[0].argmax()))
    cache = DynamicCache(config=reference.config)
    with torch.no_grad():
        out = reference(torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        theirs = [int(out.logits[0, -1].argmax())]
        for _ in range(8):
            out = reference(torch.tensor([theirs[-1:]]), past_key_values=cache, use_cache=True)
            theirs.append(int(out.logits[0, -1].argmax()))
    assert ours == theirs


def _tree_layout(
    context: list[torch.Tensor],
    context_lens: list[list[int]],
    branch_slots: list[torch.Tensor],
) -> AttentionLayout:
    """One tree-decode depth: request r's branch b sees context[r][:context_lens[r][b]] and its
    own slots branch_slots[r][b, :] (this depth's included), nothing of its sibling branches."""
    qo, kv, indices, masks = [0], [0], [], []
    for ctx, lens, own in zip(context, context_lens, branch_slots, strict=True):
        num_branches, depth = own.shape
        visible_ctx = torch.arange(ctx.numel()).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
        visible_own = torch.eye(num_branches, dtype=torch.bool).repeat_interleave(depth, dim=1)
        masks.append(torch.cat([visible_ctx, visible_own], dim=1).reshape(-1))
        indices.append(torch.cat([ctx, own.reshape(-1)]))
        qo.append(qo[-1] + num_branches)
        kv.append(kv[-1] + ctx.numel() + own.numel())
    return AttentionLayout(
        qo_indptr=torch.tensor(qo, dtype=torch.int32),
        kv_indptr=torch.tensor(kv, dtype=torch.int32),
        kv_indices=torch.cat(indices),
        custom_mask=torch.cat(masks),
    )


def test_tree_decode_step_matches_each_branch_alone(draft, reference, close):
    """THE key test: glue + fork + tree decode over many branches of several requests, one
    forward per depth, equals decoding every branch on its own with plain HF forwards."""
    gamma, depth = 3, 3
    gen = torch.Generator().manual_seed(3)
    prefixes = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (12, 5, 20)]
    prefix_slots, prefill_logits = _prefill(draft, prefixes)

    # Glue decode: the current draft d_1..d_gamma of every request, fed in one forward.
    glue = [torch.randint(0, VOCAB, (gamma,), generator=gen).tolist() for _ in prefixes]
    glue_slots = [draft.kv_pool.alloc(gamma) for _ in prefixes]
    glue_logits = draft.forward(
        torch.tensor([t for g in glue for t in g]),
        torch.cat([torch.arange(len(p), len(p) + gamma) for p in prefixes]),
        torch.cat(glue_slots),
        _causal_layout(prefix_slots, glue_slots),
    )
    for r, prefix in enumerate(prefixes):
        close(
            glue_logits[r * gamma : (r + 1) * gamma],
            _full_logits(reference, prefix + glue[r])[-gamma:],
        )

    # Fork: branches at different depths k in 0..gamma (several per depth, one at k = gamma).
    forks = [[0, 0, 1, 2, 3, 3], [1, 3], [0, 2, 2, 2, 3]]
    branch_tokens = [
        torch.randint(0, VOCAB, (len(ks),), generator=gen).tolist() for ks in forks
    ]  # the bonus candidates t* fed at the first tree depth
    context = [torch.cat([p, g]) for p, g in zip(prefix_slots, glue_slots, strict=True)]
    sequences = [
        [prefixes[r] + glue[r][:k] + [branch_tokens[r][b]] for b, k in enumerate(ks)]
        for r, ks in enumerate(forks)
    ]
    own_slots = [EMPTY.view(len(ks), 0) for ks in forks]
    start = draft.forward_count
    for step in range(depth):
        new = [draft.kv_pool.alloc(len(ks)) for ks in forks]
        own_slots = [
            torch.cat([o, s.unsqueeze(1)], dim=1) for o, s in zip(own_slots, new, strict=True)
        ]
        tokens = torch.tensor([seq[-1] for seqs in sequences for seq in seqs])
        positions = torch.tensor([len(seq) - 1 for seqs in sequences for seq in seqs])
        context_lens = [[len(prefixes[r]) + k for k in ks] for r, ks in enumerate(forks)]
        logits = draft.forward(
            tokens,
            positions,
            torch.cat(new),
            _tree_layout(context, context_lens, own_slots),
        )
        row = 0
        for seqs in sequences:
            for seq in seqs:
                expected = _full_logits(reference, seq)[-1]
                close(logits[row], expected, msg=f"{step=} {row=}")
                seq.append(int(logits[row].argmax()))  # greedy continuation per branch
                row += 1
    assert draft.forward_count - start == depth
    # Rollback: dropping every branch returns exactly their slots to the pool.
    used = draft.kv_pool.num_used
    draft.kv_pool.free(torch.cat([o.reshape(-1) for o in own_slots]))
    assert draft.kv_pool.num_used == used - sum(len(ks) for ks in forks) * depth
    assert prefill_logits.shape[0] == sum(len(p) for p in prefixes)


def test_forward_argument_errors(draft):
    slots = draft.kv_pool.alloc(3)
    with pytest.raises(ValueError, match="layout describes"):
        draft.forward(
            torch.tensor([1, 2]),
            torch.tensor([0, 1]),
            slots[:2],
            _causal_layout([EMPTY], [slots]),
        )
    with pytest.raises(ValueError, match="same length"):
        draft.forward(torch.tensor([1, 2]), torch.tensor([0]), slots[:2], None)
    draft.kv_pool.free(slots[2:])
    with pytest.raises(ValueError, match="not allocated"):
        draft.forward(
            torch.tensor([1]),
            torch.tensor([0]),
            slots[2:],
            _causal_layout([EMPTY], [slots[2:]]),
        )


@pytest.mark.skipif(
    not (REAL_DRAFT / "config.json").is_file(), reason="converted Qwen2.5-Coder-0.5B not present"
)
def test_real_draft_prefill_and_tree_step():
    """The real bf16 0.5B draft: prefill logits track HF's own forward; a tree step agrees."""
    draft = DraftModel.load(REAL_DRAFT, dtype=torch.bfloat16, num_slots=256)
    assert draft.vocab_size == 151936 and draft.num_layers == 24
    assert 151645 in draft.eos_token_ids
    prompt = [14582, 264, 13027, 729, 311, 12564, 279, 55129, 52962, 1372, 13, 198, 750]
    slots, logits = _prefill(draft, [prompt])
    draft.hf.set_attn_implementation("sdpa")  # HF's own attention as the reference
    try:
        expected = _full_logits(draft.hf, prompt)
    finally:
        draft.hf.set_attn_implementation("ssd_paged")
    # Same weights and dtype, different attention kernels: the argmax agrees, logits are close.
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9
    assert (logits - expected).abs().max() < 0.5
    # One branch forking off the prefix equals a plain causal decode of the same token.
    new = draft.kv_pool.alloc(2)
    tree = _tree_layout([slots[0]], [[len(prompt) - 1, len(prompt)]], [new.view(2, 1)])
    out = draft.forward(
        torch.tensor([prompt[-1], 11]), torch.tensor([len(prompt) - 1, len(prompt)]), new, tree
    )
    torch.testing.assert_close(out[0], logits[-1], atol=0.15, rtol=0.05)
