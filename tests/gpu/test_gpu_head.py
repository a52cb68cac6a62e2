"""An EAGLE-3 head speculator on the GPU: the target's features stay on the
speculator's device (`TargetFeatures.at` allocates there) and the head's paged forward on CUDA
equals the same forward on the CPU.

The head is a random tiny one built from its config (no training; `sglang_ssd.testing` is not
imported on the GPU machine).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
T, HIDDEN, VOCAB = 7, 64, 128


def test_features_stay_on_the_gpu_and_the_head_equals_the_cpu(
    cuda: torch.device, record_property
) -> None:
    from sglang_ssd.eagle3 import Eagle3Config, Eagle3Head
    from sglang_ssd.speculator.head_model import HeadDraftModel, HeadInputs
    from sglang_ssd.speculator.kv_pool import KVPool
    from sglang_ssd.speculator.packing import causal_segment, pack
    from sglang_ssd.speculator.target_features import TargetFeatures

    config = Eagle3Config.from_dict({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024,
        "vocab_size": VOCAB, "draft_vocab_size": 100, "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
    })  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    state = Eagle3Head(config).state_dict()
    embed = torch.randn(VOCAB, HIDDEN, generator=gen)
    ids = torch.randint(0, VOCAB, (T,), generator=gen)
    feats = torch.randn(T, 3 * HIDDEN, generator=gen)
    logits = {}
    for device in (torch.device("cpu"), cuda):
        head = Eagle3Head(config)
        head.load_state_dict(state)
        head = head.to(device).eval()
        head.attach_target(embed.to(device))
        c = head.config
        pool = KVPool(1, 64, c.num_key_value_heads, c.head_dim, torch.float32, device)
        model = HeadDraftModel(head, pool)
        store = TargetFeatures()
        store.add(0, feats.to(device))
        got, known = store.at(0, T)
        assert got is not None and got.device.type == device.type, "features left the device"
        slots = model.kv_pool.alloc(T)
        packed = pack([causal_segment(torch.empty(0, dtype=torch.int64), ids, 0, slots)])
        inputs = HeadInputs(packed.head_inputs.prev_slots, got, known)
        out = model.forward(
            packed.input_ids, packed.positions, packed.out_slots, packed.layout,
            head_inputs=inputs,
        )  # fmt: skip
        logits[device.type] = out.cpu()
    finite = torch.isfinite(logits["cpu"])
    err = (logits["cuda"][finite] - logits["cpu"][finite]).abs().max().item()
    assert torch.equal(finite, torch.isfinite(logits["cuda"])) and err <= 1e-3, f"error {err:.2e}"
    record_property("detail", f"head logits CUDA vs CPU: max error {err:.1e}")
