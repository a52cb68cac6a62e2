"""Register the ops SGLang calls as `torch.ops.sgl_kernel.*` (torch.library, CPU dispatch key).

Only ops that SGLang reaches through `torch.ops` are registered; the others are plain Python
functions imported from `sgl_kernel`. Schemas follow the pinned SGLang call sites
(layers/attention/intel_amx_backend.py), argument for argument.

Never register `convert_weight_packed` (SGLang takes its presence to mean the AMX kernels are
there) or any op SGLang probes with `hasattr` to choose a fast path (`fused_qk_norm_cpu`,
`fused_qk_norm_rope_cpu`, ...): those probes must keep failing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_ssd_kernels.cpu_ops.attention import decode_attention_cpu, extend_attention_cpu

NAMESPACE = "sgl_kernel"

SCHEMAS: dict[str, tuple[str, Callable[..., None]]] = {
    "decode_attention_cpu": (
        "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, "
        "float k_scale, float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, "
        "Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
        decode_attention_cpu,
    ),
    "extend_attention_cpu": (
        "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
        "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
        "Tensor extend_start_loc, int? max_len_extend, float sm_scale, float logit_cap, "
        "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
        "Tensor? custom_mask, bool is_causal) -> ()",
        extend_attention_cpu,
    ),
}

# Names SGLang probes with hasattr(torch.ops.sgl_kernel, ...) to pick AMX, fused or transfer paths
# (grep of the pinned wheel); none may ever be registered here.
PROBED_BY_SGLANG = frozenset(
    {
        "convert_weight_packed",
        "fused_qk_norm_cpu",
        "fused_qk_norm_rope_cpu",
        "gdn_attention",
        "get_device_accessible_ptr",
        "shm_group_initialize",
        "transfer_embedding_ranges_direct",
    }
)

_library: torch.library.Library | None = None
_registered: set[str] = set()


def register_torch_ops() -> list[str]:
    """Define and implement the ops in `SCHEMAS` under `torch.ops.sgl_kernel` (idempotent).

    Returns:
        Names registered by this call (empty when they already were).

    Raises:
        RuntimeError: an op of that name exists but was registered by someone else (e.g. the
            real `sgl_kernel` extension is loaded in this process).
    """
    global _library
    if _library is None:
        _library = torch.library.Library(NAMESPACE, "FRAGMENT")
    added = []
    for name, (schema, impl) in SCHEMAS.items():
        if name in _registered:
            continue
        if name in PROBED_BY_SGLANG:
            raise RuntimeError(f"{name} must stay unregistered: SGLang probes it with hasattr")
        if hasattr(getattr(torch.ops, NAMESPACE), name):
            raise RuntimeError(
                f"torch.ops.{NAMESPACE}.{name} already exists: another sgl_kernel build is "
                "loaded; the pure-torch ops must not be installed beside it"
            )
        _library.define(schema)
        _library.impl(name, impl, "CPU")
        _registered.add(name)
        added.append(name)
    return added
