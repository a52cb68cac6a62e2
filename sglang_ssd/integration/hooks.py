"""SGLang hooks for SSD's API surface: request checks, admin endpoints, metrics.

Registered with SGLang's `HookRegistry` from the plugin's `load()`. Every hook first checks that
this server runs `--speculative-algorithm SSD` and otherwise calls SGLang's function unchanged,
so AR, STANDALONE and other servers behave exactly as without the plugin.

Hooks are registered only in the process whose objects they wrap, because registering a target
imports its module: the front-end hooks (tokenizer manager, HTTP server, OpenAI adapters) in
the main process (the one without a multiprocessing parent), the scheduler hooks in processes
that have already imported SGLang's scheduler (the scheduler subprocess).

| target | type | what |
|---|---|---|
| `http_server.serve_generate_request` | AROUND | 400 for refused options before streaming |
| `OpenAIServingCompletion/Chat._convert_to_internal_request` | AFTER | same, for /v1 |
| `TokenizerManager._create_tokenized_object` | AFTER | same, on SGLang's final params |
| `TokenizerManager._validate_one_request` | BEFORE | 400 for empty prompts, ids outside vocab |
| `TokenizerManager.update_request_meta_info` | AROUND | `ssd_*` fields in `meta_info` |
| `http_server._setup_and_run_http_server` | BEFORE | add `/ssd/config`, `/ssd/stats` |
| `Scheduler.__init__` | AFTER | start the admin bridge thread |
| `Scheduler.get_output_streamer_class` | AROUND | emit per-request SSD counts |
| `SchedulerMetricsReporter.report_decode_stats` | AROUND | decode log line, gauges |
| `Req.update_finish_state` | AROUND | a run finishes at its first stop, as plain decoding would |
| `ModelRunner.init_spec_aux_hidden_state` | AFTER | capture an EAGLE-3 head draft's features |
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

from sglang_ssd.integration import (
    admin,
    eagle3_capture,
    finish_order,
    request_checks,
    request_metrics,
    scheduler_metrics,
)
from sglang_ssd.integration.registration import is_ssd

logger = logging.getLogger(__name__)

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_HTTP = "sglang.srt.entrypoints.http_server"
_OPENAI = "sglang.srt.entrypoints.openai"
_SCHEDULER = "sglang.srt.managers.scheduler"


def _server_is_ssd(tokenizer_manager: Any) -> bool:
    """Whether the server this tokenizer manager fronts runs SSD."""
    args = getattr(tokenizer_manager, "server_args", None)
    return is_ssd(getattr(args, "speculative_algorithm", None))


# ------------------------------------------------------------------ main process
async def _serve_generate_request(original: Callable[..., Any], obj: Any, request: Any) -> Any:
    """/generate: answer 400 before SGLang starts a (possibly streaming) response."""
    from sglang.srt.entrypoints import http_server

    state = http_server.get_global_state()
    if state is not None and _server_is_ssd(state.tokenizer_manager):
        try:
            request_checks.check_generate_input(obj)
        except request_checks.SSDRequestError as exc:
            return http_server._create_error_response(exc)
    return await original(obj, request)


def _check_openai_request(result: Any, serving: Any, *args: Any, **kwargs: Any) -> None:
    """/v1 completions and chat: check the adapted `GenerateReqInput` (grammars included)."""
    if _server_is_ssd(serving.tokenizer_manager):
        adapted = result[0] if isinstance(result, tuple) else result
        request_checks.check_generate_input(adapted)


def _check_tokenized(result: Any, manager: Any, *args: Any, **kwargs: Any) -> None:
    """Every tokenized request: SGLang's final `SamplingParams`, server defaults merged in."""
    if _server_is_ssd(manager) and hasattr(result, "custom_logit_processor"):
        request_checks.check_tokenized(result)


def _check_prompt(manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """Refuse prompts that would crash the scheduler (empty, ids outside the vocabulary)."""
    if _server_is_ssd(manager) and not getattr(obj, "contains_mm_input", lambda: False)():
        request_checks.check_prompt(input_ids, manager.model_config.vocab_size)


def _add_admin_routes(*args: Any, **kwargs: Any) -> None:
    """Add the `/ssd/*` routes before uvicorn starts (SSD servers only)."""
    server_args = kwargs.get("server_args", args[0] if args else None)
    port_args = kwargs.get("port_args", args[3] if len(args) > 3 else None)
    if not is_ssd(getattr(server_args, "speculative_algorithm", None)) or port_args is None:
        return
    from sglang.srt.entrypoints.http_server import app

    from sglang_ssd.integration.admin_routes import add_routes

    dp_size = int(getattr(server_args, "dp_size", 1) or 1)
    add_routes(app, admin.admin_addresses(port_args, dp_size))


# ------------------------------------------------------------------ scheduler process
def _start_admin_server(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """Once the scheduler has built its SSD worker, serve the admin bridge for it (on the rank
    that drives the speculator: with `--tp-size` > 1 TP rank 0, whose settings and stats the
    others follow; one socket per DP replica)."""
    from sglang_ssd.worker.ssd_worker import SSDWorker

    worker = getattr(scheduler, "draft_worker", None)
    port_args = kwargs.get("port_args", args[1] if len(args) > 1 else None)
    if isinstance(worker, SSDWorker) and worker.leads and port_args is not None:
        scheduler.ssd_admin_server = admin.start_admin_server(worker, port_args, scheduler)


def install() -> None:
    """Register the hooks this process needs (see the module docstring)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks: list[tuple[str, Callable[..., Any], HookType]] = []
    if multiprocessing.parent_process() is None:
        hooks += [
            (f"{_HTTP}.serve_generate_request", _serve_generate_request, HookType.AROUND),
            (
                f"{_OPENAI}.serving_completions.OpenAIServingCompletion."
                "_convert_to_internal_request",
                _check_openai_request,
                HookType.AFTER,
            ),
            (
                f"{_OPENAI}.serving_chat.OpenAIServingChat._convert_to_internal_request",
                _check_openai_request,
                HookType.AFTER,
            ),
            (f"{_TM}._create_tokenized_object", _check_tokenized, HookType.AFTER),
            (f"{_TM}._validate_one_request", _check_prompt, HookType.BEFORE),
            (f"{_TM}.update_request_meta_info", request_metrics.update_meta_info, HookType.AROUND),
            (f"{_HTTP}._setup_and_run_http_server", _add_admin_routes, HookType.BEFORE),
        ]
    if _SCHEDULER in sys.modules:
        reporter = "sglang.srt.managers.scheduler_components.metrics_reporter"
        hooks += [
            (f"{_SCHEDULER}.Scheduler.__init__", _start_admin_server, HookType.AFTER),
            (
                f"{_SCHEDULER}.Scheduler.get_output_streamer_class",
                request_metrics.pick_output_streamer_class,
                HookType.AROUND,
            ),
            (
                f"{reporter}.SchedulerMetricsReporter.report_decode_stats",
                scheduler_metrics.report_decode_stats,
                HookType.AROUND,
            ),
            (
                "sglang.srt.managers.schedule_batch.Req.update_finish_state",
                finish_order.update_finish_state,
                HookType.AROUND,
            ),
            (eagle3_capture.HOOK_TARGET, eagle3_capture.enable_feature_capture, HookType.AFTER),
        ]
    for target, fn, kind in hooks:
        HookRegistry.register(target, fn, kind)
    logger.debug("sglang-ssd: registered %d SGLang hooks", len(hooks))
