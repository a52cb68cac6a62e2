"""A canary for the SGLang pin: the internals the plugin leans on are there.

SSD plugs into SGLang 0.5.23 below its public API: it presents as NGRAM (`NgramVerifyInput`,
`is_ngram()`), returns spec-v2 `GenerationBatchResult`s, moves KV with
`move_accept_tokens_to_target_kvcache`, registers through `SpeculativeAlgorithm.register` and
wraps SGLang functions with `HookRegistry`. A renamed parameter or attribute there would not
fail an import: it would fail a request, or silently change what a call means (say,
`num_correct_drafts` becoming an accept length). Bumping SGLang must fail here first, each
assertion naming what moved.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import multiprocessing
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sglang_ssd"


def _resolve(path: str) -> Any:
    """The object at a dotted `path` ("pkg.module.Class.attr"), or a failure naming it."""
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        pytest.fail(f"SGLang moved {path}: {exc!r}")


def _params(path: str) -> list[str]:
    return list(inspect.signature(_resolve(path)).parameters)


def _fields(cls: type) -> set[str]:
    """Field names of a dataclass or msgspec struct."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ()))


def _sets_attribute(cls: type, name: str) -> bool:
    """Whether `cls` or a base declares `name` or assigns `self.<name>` in its source."""
    assign = re.compile(rf"\bself\.{name}\s*(:[^=\n]+)?=[^=]")
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}) or name in vars(klass):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if assign.search(source):
            return True
    return False


def _sglang_imports() -> list[str]:
    """Every "module.name" that sglang_ssd imports from SGLang (`from sglang... import name`)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sglang":
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(found)


@pytest.mark.parametrize("path", _sglang_imports())
def test_every_name_the_plugin_imports_exists(path: str) -> None:
    _resolve(path)


# (callable, parameter names it must have, in this order, from the first; the plugin passes
# these by position or by name, as commented).
SIGNATURES: list[tuple[str, list[str]]] = [
    # worker/ssd_worker.py: (batch, accept_index, accept_lens - 1, allocator) by position.
    (
        "sglang.srt.speculative.spec_utils.move_accept_tokens_to_target_kvcache",
        ["batch", "accept_index", "num_correct_drafts", "token_to_kv_pool_allocator"],
    ),
    # worker/ssd_worker.py: every argument by name.
    (
        "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func",
        [
            "req_pool_indices",
            "req_to_token",
            "start_offset",
            "end_offset",
            "batch_size",
            "draft_token_num",
            "device",
        ],
    ),
    (
        "sglang.srt.layers.logprob_processor.compute_spec_logprobs",
        ["batch", "logits_output", "predict", "accept_index"],
    ),
    (
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
        ["self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify"],
    ),
    # integration/registration.py: SSDSpecAlgo.create_future_map builds one positionally.
    (
        "sglang.srt.managers.overlap_utils.FutureMap.__init__",
        [
            "self",
            "device",
            "spec_algo",
            "req_to_token_pool",
            "needs_cpu_seq_lens",
            "needs_confidence_relay",
        ],
    ),
    ("sglang.srt.speculative.spec_registry.get_spec", ["name"]),
    (
        "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.note_request_finished",
        ["self", "rid", "natural_stop"],
    ),
    ("sglang.srt.speculative.base_spec_worker.BaseSpecWorker.clear_cache_pool", ["self"]),
    ("sglang.srt.plugins.hook_registry.HookRegistry.register", ["target", "hook", "hook_type"]),
    ("sglang.srt.utils.auth.auth_level", ["level"]),
    ("sglang.srt.runtime_context.get_spec", []),
    ("sglang.srt.runtime_context.get_device", []),
    # integration/hooks.py and request_metrics.py: the hooked functions, called positionally.
    ("sglang.srt.entrypoints.http_server.serve_generate_request", ["obj", "request"]),
    (
        "sglang.srt.entrypoints.http_server._setup_and_run_http_server",
        ["server_args", "tokenizer_manager", "template_manager", "port_args"],
    ),
    (
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        ["self", "obj", "input_ids"],
    ),
    (
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
        ["self", "meta_info", "state", "customized_info", "index", "finish_reason"],
    ),
    ("sglang.srt.managers.scheduler.Scheduler.__init__", ["self", "server_args", "port_args"]),
    ("sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class", ["self"]),
    (
        "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer."
        "build_additional_customized_info",
        ["self", "reqs"],
    ),
    ("sglang.srt.entrypoints.http_server._create_error_response", ["e"]),
    # integration/finish_order.py: the hooked finish check and the stop-token rule it reuses.
    (
        "sglang.srt.managers.schedule_batch.Req.update_finish_state",
        ["self", "new_accepted_len"],
    ),
    (
        "sglang.srt.managers.schedule_batch.Req._check_token_based_finish",
        ["self", "new_accepted_tokens"],
    ),
    ("sglang.srt.runtime_context.get_server_args", []),
    # integration/eagle3_capture.py: hooked AFTER, the runner positionally.
    ("sglang.srt.model_executor.model_runner.ModelRunner.init_spec_aux_hidden_state", ["self"]),
]


@pytest.mark.parametrize(("path", "expected"), SIGNATURES, ids=[p for p, _ in SIGNATURES])
def test_signatures_the_plugin_calls(path: str, expected: list[str]) -> None:
    params = _params(path)
    assert params[: len(expected)] == expected, (
        f"SGLang changed the parameters of {path}: the plugin relies on {expected}, "
        f"SGLang now has {params}"
    )


def test_keyword_arguments_the_plugin_passes() -> None:
    keywords = {
        # worker/ssd_worker.py builds SSDVerifyInput (an NgramVerifyInput) by keyword.
        "sglang.srt.speculative.ngram_info.NgramVerifyInput.__init__": {
            "draft_token", "custom_mask", "positions", "draft_token_num", "new_seq_lens",
            "accept_tokens", "accept_lens",
        },
        # worker/ssd_worker.py: an EAGLE-3 head draft's forwards capture FULL.
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": {
            "is_verify", "capture_hidden_mode",
        },
        # integration/registration.py
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register": {
            "name", "supports_overlap", "validate_server_args", "spec_class",
        },
    }  # fmt: skip
    for path, names in keywords.items():
        missing = names - set(_params(path))
        assert not missing, f"SGLang dropped keyword(s) {sorted(missing)} of {path}"


def test_spec_v2_result_and_batch_fields() -> None:
    """The fields SSDWorker reads from SGLang's batch and writes into its result."""
    needed = {
        "sglang.srt.managers.utils.GenerationBatchResult": {
            "logits_output", "next_token_ids", "can_run_cuda_graph", "accept_lens",
            "new_seq_lens", "next_draft_input", "speculative_num_draft_tokens",
        },
        "sglang.srt.managers.schedule_batch.ScheduleBatch": {
            "reqs", "seq_lens", "req_pool_indices", "req_to_token_pool", "forward_mode",
            "input_ids", "out_cache_loc", "spec_info", "return_logprob", "sampling_info",
            "prefix_lens", "extend_lens",
        },
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo": {
            "temperatures", "top_ks", "top_ps", "min_ps", "need_min_p_sampling",
        },
        "sglang.srt.layers.logits_processor.LogitsProcessorOutput": {
            "next_token_logits", "hidden_states",
        },
        # integration/eagle3_capture.py
        "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state."
        "SpecAuxHiddenStateConfig": {
            "eagle_use_aux_hidden_state", "eagle_aux_hidden_state_layer_ids",
        },
        # runtime_context.get_spec() / get_device() bags (SSDWorker.__init__)
        "sglang.srt.arg_groups.fields.spec.Spec": {
            "speculative_num_steps", "speculative_num_draft_tokens",
            "speculative_draft_model_path",
        },
        "sglang.srt.arg_groups.fields.device.Device": {"device"},
        # integration/registration.py and request_checks.py
        "sglang.srt.server_args.ServerArgs": {
            "model_path", "tokenizer_path", "trust_remote_code", "speculative_algorithm",
            "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "tp_size", "pp_size", "dp_size",
            "tokenizer_worker_num", "enable_watermark", "enable_strict_thinking",
            "preferred_sampling_params", "max_running_requests", "disable_overlap_schedule",
            "enable_mixed_chunk", "random_seed", "disable_radix_cache",
            "enable_return_hidden_states",
        },
        "sglang.srt.managers.io_struct.GenerateReqInput": {
            "sampling_params", "custom_logit_processor", "watermark",
        },
        "sglang.srt.managers.io_struct.TokenizedGenerateReqInput": {
            "sampling_params", "custom_logit_processor",
        },
    }  # fmt: skip
    for path, names in needed.items():
        cls = _resolve(path)
        have = _fields(cls) or {n for n in names if _sets_attribute(cls, n)}
        missing = names - have
        assert not missing, f"SGLang's {path} lost field(s) {sorted(missing)}"


def test_instance_attributes_the_plugin_reads() -> None:
    needed = {
        "sglang.srt.managers.schedule_batch.Req": ["rid", "output_ids", "origin_input_ids"],
        "sglang.srt.managers.tp_worker.TpModelWorker": ["model_runner"],
        "sglang.srt.model_executor.model_runner.ModelRunner": [
            "model_config", "server_args", "is_draft_worker", "spec_aux_config",
        ],
        "sglang.srt.configs.model_config.ModelConfig": ["vocab_size"],
        "sglang.srt.managers.tokenizer_manager.TokenizerManager": ["server_args", "model_config"],
        # integration/admin.py, hooks.py, request_metrics.py, scheduler_metrics.py
        "sglang.srt.managers.scheduler.Scheduler": [
            "draft_worker", "spec_algorithm", "running_batch", "waiting_queue",
        ],
        "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter": [
            "scheduler", "forward_ct_decode", "decode_log_interval",
            "current_scheduler_metrics_enabled", "metrics_collector",
        ],
        "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer": [
            "has_additional_customized_info",
        ],
    }  # fmt: skip
    for path, names in needed.items():
        cls = _resolve(path)
        missing = [n for n in names if not _sets_attribute(cls, n)]
        assert not missing, f"SGLang's {path} no longer sets {missing}"


def test_ssd_presents_as_ngram() -> None:
    """SSDSpecAlgo answers the scheduler's algorithm questions as NGRAM does; SSDVerifyInput
    overrides NgramVerifyInput's chain shape."""
    algorithm = _resolve("sglang.srt.speculative.spec_info.SpeculativeAlgorithm")
    custom = _resolve("sglang.srt.speculative.spec_registry.CustomSpecAlgo")
    asked = ["is_ngram", "has_draft_kv", "carries_draft_hidden_states", "create_future_map",
             "need_topk"]  # fmt: skip
    missing = [name for name in asked if not callable(getattr(algorithm, name, None))]
    assert not missing, f"the scheduler no longer asks SpeculativeAlgorithm {missing}"
    missing = [
        n for n in ("is_ngram", "has_draft_kv", "handle_server_args") if not hasattr(custom, n)
    ]
    assert not missing, f"CustomSpecAlgo lost {missing} (SSDSpecAlgo overrides them)"
    verify_input = _resolve("sglang.srt.speculative.ngram_info.NgramVerifyInput")
    for name in ("tree_topk", "max_tree_depth"):
        assert isinstance(inspect.getattr_static(verify_input, name, None), property), (
            f"NgramVerifyInput.{name} is no longer a property (SSDVerifyInput overrides it)"
        )
    base = _resolve("sglang.srt.speculative.base_spec_worker.BaseSpecWorker")
    overridden = ["draft_worker", "alloc_memory_pool", "clear_cache_pool",
                  "note_request_finished", "on_verify_complete_cpu"]  # fmt: skip
    missing = [name for name in overridden if inspect.getattr_static(base, name, None) is None]
    assert not missing, f"BaseSpecWorker lost {missing} (SSDWorker overrides or inherits them)"
    mode = _resolve("sglang.srt.model_executor.forward_batch_info.ForwardMode")
    missing = [n for n in ("TARGET_VERIFY", "DECODE", "is_decode") if not hasattr(mode, n)]
    assert not missing, f"ForwardMode lost {missing}"
    # integration/cpu_platform.py: reads the AMX fact and overrides it (facts resolve lazily).
    has_amx = _resolve("sglang.srt.runtime_context.get_platform")().has_amx
    assert isinstance(has_amx, bool), f"get_platform().has_amx is {has_amx!r}, not a bool"
    override = _resolve("sglang.srt.runtime_context.override_platform")(has_amx=True)
    assert callable(getattr(override, "install", None)), "override_platform(...).install moved"
    level = _resolve("sglang.srt.utils.auth.AuthLevel")
    assert hasattr(level, "ADMIN_OPTIONAL"), "AuthLevel.ADMIN_OPTIONAL moved (/ssd/* routes)"


def test_every_hook_target_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    """`hooks.install()` registers, here captured instead: each target is a real attribute
    and each hook type exists."""
    import sglang.srt.managers.scheduler  # noqa: F401  (install() adds the scheduler hooks)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ssd.integration import hooks

    captured: list[tuple[str, Callable[..., Any], Any]] = []
    monkeypatch.setattr(HookRegistry, "register", lambda *args: captured.append(args))
    assert multiprocessing.parent_process() is None  # the front-end hooks are installed too
    hooks.install()
    assert len(captured) >= 10, f"only {len(captured)} hooks registered: {captured}"
    for target, _, kind in captured:
        assert kind in HookType, f"{kind!r} is not a HookType"
        module, _, attribute = target.rpartition(".")
        owner = _resolve(module)
        assert hasattr(owner, attribute), f"SGLang moved the hook target {target}"


# SGLang's per-request sampling options, by how SSD treats them: a new one must be
# classified here (applied in `saguaro.verify` / `worker.request_options`, or refused in
# request_checks) before SSD serves it.
APPLIED = {"temperature", "top_p", "top_k", "min_p"}
REFUSED = {"beam_width", "watermark"}
P_NEUTRAL = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "n", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "sampling_seed", "custom_params", "stop_strs", "stop_regex_strs", "stop_str_max_len",
    "stop_regex_max_len", "is_normalized",
}  # fmt: skip


def test_sampling_options_are_all_classified() -> None:
    from sglang_ssd.worker.request_options import GRAMMAR_OPTIONS, SHAPED_OPTIONS

    applied = APPLIED | set(SHAPED_OPTIONS) | set(GRAMMAR_OPTIONS)
    options = _fields(_resolve("sglang.srt.sampling.sampling_params.SamplingParams"))
    known = applied | REFUSED | P_NEUTRAL
    assert options == known, (
        f"SGLang's SamplingParams changed: new {sorted(options - known)}, "
        f"gone {sorted(known - options)}; classify them (applied, refused, p-neutral)"
    )
    from sglang_ssd.integration import request_checks

    assert request_checks.sampling_refusal({"beam_width": 2}) is not None
    assert request_checks.request_refusal({}, None, {"enabled": True}) is not None
    for name in SHAPED_OPTIONS + GRAMMAR_OPTIONS:
        assert request_checks.sampling_refusal({name: 1}) is None, f"{name} is applied, not refused"
