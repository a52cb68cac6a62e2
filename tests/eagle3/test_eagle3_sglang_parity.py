"""Our EAGLE-3 head against SGLang 0.5.23's `LlamaForCausalLMEagle3`, and the file format both read.

A random head is written with `save_head`; SGLang's class (built on the CPU, see `sglang_cpu`)
loads that folder with its own `load_weights`, its embeddings set to the same target embeddings
(what SGLang's `set_embed` does). Both then run the same request: a prefill of 7 tokens fed
target features, then 2 draft decode steps fed the head's own hidden back, on SGLang's
torch_native attention over its KV pool. Compared: the logits at every position (SGLang's
`model.model` normed hidden times its `lm_head`, first `draft_vocab_size` rows), SGLang's own
`forward` logits of the prefill's last token (its LogitsProcessor), the hidden fed back
(SGLang's aux output), and `hot_token_id` against our `target_token_ids`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_ssd.eagle3 import Eagle3Head, save_head
from sglang_ssd.testing.eagle3_heads import HIDDEN, VOCAB, head_config, random_head

ATOL = 1e-5
PROMPT = 7
DECODE_STEPS = 2

VARIANTS = {
    "d2t": {},
    "fc_norm": {"fc_norm": True},
    "use_aux_norm": {"use_aux_norm": True},
    "norm_before_fc": {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "norm_before_fc": True}
    },
    "norm_output": {"norm_output": True},
    "full_vocab": {"draft_vocab_size": None},
    "two_features_own_embeddings": {
        "target_hidden_size": 48,
        "num_aux_hidden_states": 2,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 5]},
    },
    "llama3_rope": {
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
}


def sglang_head(folder: Path) -> torch.nn.Module:
    """SGLang's `LlamaForCausalLMEagle3` of `folder`, every parameter NaN before its own
    `load_weights` reads the folder's tensors (so what it leaves unassigned shows)."""
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    model = LlamaForCausalLMEagle3(AutoConfig.from_pretrained(folder)).float()
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    model.load_weights(iter(load_file(folder / "model.safetensors").items()))
    return model


def unassigned(model: torch.nn.Module, rows: int, shared_embed: bool) -> list[str]:
    """Parameters SGLang's load left NaN (the lm_head's first `rows` rows; padding aside)."""
    out = []
    for name, param in model.named_parameters():
        if name == "model.embed_tokens.weight" and shared_embed:
            continue  # SGLang's eagle worker sets it from the target (`set_embed`)
        if name == "lm_head.weight":
            param = param[:rows]
        if param.isnan().any():
            out.append(name)
    return out


def attach(ours: Eagle3Head, theirs: torch.nn.Module, embed: torch.Tensor, lm: torch.Tensor):
    """The target's embeddings (and LM head for a full-vocabulary head) on both heads."""
    if ours.config.own_embeddings:
        ours.attach_target(None, None)
    else:
        ours.attach_target(embed, lm if ours.lm_head is None else None)
        theirs.set_embed(torch.nn.Parameter(embed.clone()))
    if ours.lm_head is None:
        theirs.lm_head.weight.data[:VOCAB] = lm


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_head_equals_sglang(sglang_world: None, tmp_path: Path, variant: str) -> None:
    from sglang_cpu import SGLangCPU

    ours = random_head(head_config(**VARIANTS[variant]), seed=len(variant)).eval()
    config = ours.config
    folder = save_head(tmp_path / "head", ours)
    theirs = sglang_head(folder)
    rows = config.lm_head_rows
    assert unassigned(theirs, rows, not config.own_embeddings) == (
        ["lm_head.weight"] if config.draft_vocab_size is None else []
    ), "SGLang's load_weights left parameters unassigned"

    generator = torch.Generator().manual_seed(1)
    embed = torch.randn(VOCAB, HIDDEN, generator=generator)
    lm = torch.randn(VOCAB, HIDDEN, generator=generator)
    attach(ours, theirs, embed, lm)
    if config.draft_vocab_size is not None:
        assert torch.equal(theirs.hot_token_id, ours.target_token_ids())

    sglang = SGLangCPU(
        num_layers=1, num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim
    )
    ids = torch.randint(0, VOCAB, (PROMPT + DECODE_STEPS,), generator=generator)
    features = torch.randn(PROMPT, config.feature_size, generator=generator)

    normed, aux = sglang.run(
        lambda b: theirs.model(ids[:PROMPT], b.positions, b),
        ids[:PROMPT],
        prefix=0,
        spec_hidden=features,
    )
    last = sglang.run(
        lambda b: theirs(ids[:PROMPT], b.positions, b), ids[:PROMPT], prefix=0, spec_hidden=features
    ).next_token_logits
    with torch.no_grad():
        out = ours(ids[None, :PROMPT], features[None], torch.arange(PROMPT)[None])
    lm_rows = theirs.lm_head.weight[:rows]
    torch.testing.assert_close(out.logits[0], normed @ lm_rows.T, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logits[0, -1:], last, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden[0], aux[0], atol=ATOL, rtol=0)

    past, fed, fed_theirs = out.kv, out.hidden[:, -1:], aux[0][-1:]
    for step in range(DECODE_STEPS):
        pos = PROMPT + step
        token = ids[pos : pos + 1]
        normed, aux = sglang.run(
            lambda b, t=token: theirs.model(t, b.positions, b),
            token,
            prefix=pos,
            decode=True,
            spec_hidden=fed_theirs,
        )
        with torch.no_grad():
            out = ours(token[None], fed, torch.tensor([[pos]]), past=past)
        torch.testing.assert_close(out.logits[0], normed @ lm_rows.T, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.hidden[0], aux[0], atol=ATOL, rtol=0)
        past, fed, fed_theirs = past.extend(out.kv), out.hidden, aux[0]
