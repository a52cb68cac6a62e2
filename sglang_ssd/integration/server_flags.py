"""How SSD treats SGLang's server flags: each one it has been checked against, declared once.

`FLAGS` is the single declaration behind three things: the startup refusals
(`refuse_unsupported_flags`, called by `registration.validate_ssd_server_args`), docs/flags.md's
table of server flags (`flags_table`, rendered by `scripts/render_docs.py`) and the tests that
name each row (a "works" row names the test that serves with it, a "refused" row is started in
`tests/integration/test_server_flags.py`). A flag not listed passes through to SGLang untouched.

Refusals name the flag and say why; they are raised as `ValueError`, which SGLang's launcher
prints before it exits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_ssd.target import METHOD


def _get(cfg: Any, name: str) -> Any:
    return getattr(cfg, name, None)


def on_cpu(cfg: Any) -> bool:
    """Whether SGLang's server args (`device`, or no CUDA when it is unset) run on the CPU."""
    device = _get(cfg, "device")
    if device is None:
        import torch

        return not torch.cuda.is_available()
    return str(device).startswith("cpu")


def _gguf_target(cfg: Any) -> bool:
    path = str(_get(cfg, "model_path") or "")
    return (
        path.endswith(".gguf")
        or _get(cfg, "load_format") == "gguf"
        or _get(cfg, "quantization") == "gguf"
    )


def _other_quantization(cfg: Any) -> bool:
    """Whether `--quantization` names a method other than ours (`target.int8_method`)."""
    return _get(cfg, "quantization") not in (None, METHOD)


def _multimodal_target(cfg: Any) -> bool:
    """Whether the target's config.json names one of SGLang's multimodal architectures (a
    folder without one, e.g. a hub id, is left to SGLang)."""
    config = Path(str(_get(cfg, "model_path") or "")) / "config.json"
    if not config.is_file():
        return False
    from sglang.srt.configs.model_config import is_multimodal_model

    architectures = json.loads(config.read_text()).get("architectures") or []
    return is_multimodal_model(architectures)


def _eagle3_draft(cfg: Any) -> bool:
    """Whether the draft folder holds an EAGLE-3 head (its config.json's architecture)."""
    from sglang_ssd.eagle3.config import is_eagle3_head

    path = _get(cfg, "speculative_draft_model_path")
    return bool(path) and is_eagle3_head(str(path))


@dataclass(frozen=True)
class FlagRule:
    """One server flag (or a family of flags) and what SSD does with it.

    Attributes:
        flags: the flags as a user types them, e.g. "`--enable-lora`, `--lora-paths`".
        works: True when SSD serves with it; False when startup refuses it.
        why: the table's explanation; for a refusal, also the error message's reason.
        evidence: the test that serves with the flag, or that starts a server with it and
            sees the refusal.
        refused: for a refused row, the predicate on SGLang's server args that triggers it.
    """

    flags: str
    works: bool
    why: str
    evidence: str
    refused: Callable[[Any], bool] | None = None


_OPTIONS_TEST = "tests/integration/test_ssd_options.py"
_REFUSAL_TEST = "tests/integration/test_server_flags.py"

FLAGS: tuple[FlagRule, ...] = (
    FlagRule(
        "`--chunked-prefill-size`",
        True,
        "prompts longer than a chunk prefill in chunks; the speculator opens a request once "
        "its prefill is complete",
        _OPTIONS_TEST,
    ),
    FlagRule(
        "`--api-key`, `--admin-api-key`",
        True,
        "SGLang's keys guard every route; `POST /ssd/config` needs the admin key when one is set",
        "tests/integration/test_ssd_admin_auth.py",
    ),
    FlagRule(
        "`--grammar-backend` (xgrammar)",
        True,
        "regex, JSON schema, EBNF, structural tags, `response_format` and required or named "
        "`tool_choice` are masked per verify position with SGLang's own mask builder",
        _OPTIONS_TEST,
    ),
    FlagRule(
        "`--enable-return-hidden-states`",
        True,
        "`return_hidden_states` returns one row per output token, as the autoregressive server",
        _OPTIONS_TEST,
    ),
    FlagRule(
        "`--preferred-sampling-params`",
        True,
        "checked at startup like a request's sampling params (beam search is refused)",
        "tests/integration/test_api_units.py",
    ),
    FlagRule(
        "`--enable-metrics`",
        True,
        "SGLang's metrics plus the `sglang:ssd_*` gauges",
        "tests/integration/test_ssd_api.py",
    ),
    FlagRule(
        "`--enable-lora`, `--lora-paths`",
        False,
        "the speculator drafts with the base draft model and SSD's verify forward does not "
        "carry SGLang's per-request adapter batch; serve adapters without SSD",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_lora") or _get(cfg, "lora_paths")),
    ),
    FlagRule(
        "`--quantization ssd_int8` (on CPU)",
        True,
        "the target's linear layers and LM head in int8 (weights per output row, activations "
        "per row: a verify row equals the same row decoded alone), quantised from the bf16 "
        "checkpoint at load and cached beside it; greedy SSD equals the int8 AR server",
        "tests/integration/test_int8_target.py",
    ),
    FlagRule(
        "`--quantization` other than `ssd_int8`, GGUF targets (on CPU)",
        False,
        "SGLang 0.5.23's CPU engine has no kernels for quantised or GGUF weights without "
        "Intel's sgl_kernel build, so its autoregressive server cannot serve them either; "
        "`python -m sglang_ssd.models` converts GGUF files to bf16 (on CUDA they pass through, "
        "untested end to end)",
        _REFUSAL_TEST,
        lambda cfg: on_cpu(cfg) and (_other_quantization(cfg) or _gguf_target(cfg)),
    ),
    FlagRule(
        "`--enable-hierarchical-cache`",
        False,
        "host-memory KV offload would move target KV that SSD's verify rounds and KV moves "
        "assume stay in the device pool",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_hierarchical_cache")),
    ),
    FlagRule(
        "`--enable-torch-compile` (on CPU)",
        False,
        "SGLang's CPU graph runner compiles decode batches and asserts that no speculative "
        "algorithm runs; SSD's rounds are TARGET_VERIFY forwards (on CUDA the flag passes "
        "through to SGLang)",
        _REFUSAL_TEST,
        lambda cfg: on_cpu(cfg) and bool(_get(cfg, "enable_torch_compile")),
    ),
    FlagRule(
        "multimodal targets",
        False,
        "the speculator is a text model and never sees the images' embeddings",
        _REFUSAL_TEST,
        _multimodal_target,
    ),
    FlagRule(
        "an EAGLE-3 head as `--speculative-draft-model-path`",
        True,
        "SSD detects `LlamaForCausalLMEagle3`: the speculator runs the head over its KV pool "
        "and the target ships the head's features (its captured layers) with each Step; the "
        "radix cache must be off (next row)",
        "tests/integration/test_ssd_head_server.py",
    ),
    FlagRule(
        "an EAGLE-3 head draft without `--disable-radix-cache`",
        False,
        "the target computes no features for a prefix the radix cache holds, and the head "
        "drafts from them; start the server with `--disable-radix-cache`",
        _REFUSAL_TEST,
        lambda cfg: _eagle3_draft(cfg) and not _get(cfg, "disable_radix_cache"),
    ),
    FlagRule(
        "`--enable-return-hidden-states` with an EAGLE-3 head draft",
        False,
        "the target's forwards then return the head's features (the captured layers' inputs), "
        "not the final hidden states",
        _REFUSAL_TEST,
        lambda cfg: _eagle3_draft(cfg) and bool(_get(cfg, "enable_return_hidden_states")),
    ),
    FlagRule(
        "`--tokenizer-worker-num` > 1",
        False,
        "SSD's request checks and admin endpoints run in the single HTTP process",
        _REFUSAL_TEST,
        lambda cfg: (_get(cfg, "tokenizer_worker_num") or 1) != 1,
    ),
    FlagRule(
        "`--enable-custom-logit-processor`",
        False,
        "SGLang calls a custom logit processor once per step on committed state; SSD would "
        "have to call it at every draft position with a draft prefix it cannot be given "
        "(a request that carries one gets HTTP 400 for the same reason)",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_custom_logit_processor")),
    ),
    FlagRule(
        "`--enable-watermark`",
        False,
        "the watermark's green list is seeded from committed tokens only, not per draft position",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_watermark")),
    ),
    FlagRule(
        "`--enable-strict-thinking`",
        False,
        "it changes p through SGLang's reasoning grammar hooks, which SSD's verify does not run",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_strict_thinking")),
    ),
    FlagRule(
        "`--enable-deterministic-inference`",
        False,
        "SSD is exact in distribution, but which draft a round verifies depends on timing "
        "(a cache hit or a backup draft), so a request's `sampling_seed` cannot make its output "
        "reproducible (on CPU SGLang itself refuses the flag with intel_amx attention)",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_deterministic_inference")),
    ),
    FlagRule(
        "`--tp-size` > 1",
        True,
        "one speculator per TP group, driven by TP rank 0: it plans each round (mode, drafts, "
        "fallbacks) and verifies, and broadcasts the drafts and the verify outcome over the TP "
        "group's CPU group (`worker/tp_sync.py`); tested with two gloo ranks "
        "(`tests/worker/test_tp_sync.py`) and served end to end (tiny pair, `--tp-size 2`, "
        "greedy equals AR)",
        "tests/integration/test_ssd_tp.py",
    ),
    FlagRule(
        "`--dp-size` > 1",
        True,
        "one speculator per DP replica, on a GPU of its own after every target rank, or on CPU "
        "on its replica's own cores (replica r's entry of `SGLANG_CPU_OMP_THREADS_BIND`, equal "
        "blocks of the available cores when unset; its speculator takes the last core); "
        "startup refuses too few cores or GPUs, `--ssd-allow-shared-cores` lets tests share "
        "cores; `/ssd/config` and `/ssd/stats` list every replica",
        "tests/integration/test_ssd_scale_out.py",
    ),
    FlagRule(
        "`--attn-dp-size` > 1, `--enable-dp-attention`",
        False,
        "attention-DP ranks serve different requests inside one TP group, while SSD's TP ranks "
        "follow TP rank 0's plan for one batch; use `--dp-size` without it",
        _REFUSAL_TEST,
        lambda cfg: bool(_get(cfg, "enable_dp_attention")) or (_get(cfg, "attn_dp_size") or 1) > 1,
    ),
    FlagRule(
        "`--pp-size`, `--nnodes` > 1",
        False,
        "SSD's rounds are not split across pipeline stages, and the speculator's GPU is placed "
        "and checked on one node; serve each node as its own server behind sglang-router",
        _REFUSAL_TEST,
        lambda cfg: any((_get(cfg, n) or 1) != 1 for n in ("pp_size", "nnodes")),
    ),
)


def refuse_unsupported_flags(cfg: Any) -> None:
    """Raise for the first refused row of `FLAGS` that `cfg` (SGLang's server args) sets.

    Raises:
        ValueError: "<flags>: not supported with --speculative-algorithm SSD (<why>)".
    """
    for rule in FLAGS:
        if rule.refused is not None and rule.refused(cfg):
            raise ValueError(
                f"{rule.flags.replace('`', '')}: not supported with --speculative-algorithm SSD "
                f"({rule.why})"
            )


def flags_table() -> str:
    """docs/flags.md's table of server flags, rendered from `FLAGS` (markdown)."""
    rows = ["| flag | with SSD | why | test |", "|---|---|---|---|"]
    for rule in FLAGS:
        treatment = "works" if rule.works else "refused at startup"
        rows.append(f"| {rule.flags} | {treatment} | {rule.why} | `{rule.evidence}` |")
    return "\n".join(rows)
