"""Registers `--speculative-algorithm SSD` with SGLang's speculative-algorithm registry.

The target side of SSD is structurally SGLang's NGRAM worker: drafts come from outside the
target's model runner (here: the speculator process), the verify forward is a TARGET_VERIFY
over γ + 1 chain positions, and no draft KV lives in the target's pool. So `SSDSpecAlgo`
answers `is_ngram()` for the scheduler's plumbing (result relay, verify-input type, KV
reserve), while its own worker (`sglang_ssd.worker.ssd_worker.SSDWorker`) drafts and verifies.
It also defines the three methods the scheduler calls that `CustomSpecAlgo` lacks in SGLang
0.5.23 (`carries_draft_hidden_states`, `create_future_map`, `need_topk`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

ALGORITHM = "SSD"


def is_ssd(algorithm: Any) -> bool:
    """Whether a `--speculative-algorithm` value (a string, or SGLang's resolved algorithm
    object) is SSD."""
    name = getattr(algorithm, "name", algorithm)
    return isinstance(name, str) and name.upper() == ALGORITHM


def register_ssd() -> None:
    """Register SSD once per process (SGLang loads plugins in every process it starts)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    if get_spec(ALGORITHM) is not None:
        return

    class SSDSpecAlgo(CustomSpecAlgo):
        """SGLang's view of SSD (see the module docstring)."""

        def is_ngram(self) -> bool:
            return True

        def has_draft_kv(self) -> bool:
            return False

        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def create_future_map(
            self,
            device: Any,
            req_to_token_pool: Any,
            needs_cpu_seq_lens: bool = True,
            needs_confidence_relay: bool = False,
        ) -> Any:
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(
                device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
            )

        def handle_server_args(self, server_args: ServerArgs) -> None:
            handle_ssd_server_args(server_args)

    def _factory(server_args: ServerArgs) -> type:
        from sglang_ssd.worker.ssd_worker import SSDWorker

        return SSDWorker

    SpeculativeAlgorithm.register(
        ALGORITHM,
        supports_overlap=False,
        validate_server_args=validate_ssd_server_args,
        spec_class=SSDSpecAlgo,
    )(_factory)


def handle_ssd_server_args(server_args: ServerArgs) -> None:
    """SSD's argument resolution, the parts of SGLang's eagle-family handling that apply
    (max_running_requests 48 unless given, synchronous scheduling, no mixed chunks) plus the
    chain shape SSD verifies: top-k 1 and γ + 1 draft tokens.

    SGLang hands plugin algorithms a recorder that declares the fields written here; its own
    `_handle_eagle_family` declares on the record directly, so it cannot be called from here.
    """
    if server_args.max_running_requests is None:
        server_args.max_running_requests = 48
    steps = server_args.speculative_num_steps or 4
    server_args.speculative_num_steps = steps
    server_args.speculative_eagle_topk = 1
    server_args.speculative_num_draft_tokens = steps + 1
    server_args.disable_overlap_schedule = True
    server_args.enable_mixed_chunk = False
    disable_verify_cuda_graphs(server_args)


def disable_verify_cuda_graphs(server_args: ServerArgs) -> None:
    """Turn off SGLang's decode-phase CUDA graphs for SSD on a GPU (logged).

    SSD answers `is_ngram()`, so SGLang's `DecodeCudaGraphRunner` would capture TARGET_VERIFY
    graphs with an `NgramVerifyInput` whose `capture_hidden_mode` is NULL (SGLang 0.5.23
    `model_executor/runner/decode_cuda_graph_runner.py:2134-2146`): a replayed verify returns no
    hidden states, which an EAGLE-3 head speculator needs every round. For LM drafts the width
    (γ + 1 on CUDA) and the mask buffer refilled per round would fit the runner, but a replay of
    SSD's verify input has never run on a GPU, and a wrong replay is a wrong token. So SSD's
    verify forwards run eagerly until a GPU run times both and checks greedy equality under
    replay; what eager costs on paper is in docs/cuda.md.

    This runs in `handle_speculative_decoding`, after SGLang parsed `cuda_graph_config`, so
    it rewrites that resolved config's decode phase (writes through SGLang's plugin recorder
    are declared); the prefill phase keeps its graphs (SSD's prefill is a plain extend). On
    the CPU no graphs are captured and nothing changes; with `--ssd-verify-cuda-graph`
    (`verify_graphs`, checked by `refuse_verify_cuda_graph`) the graphs are kept.
    """
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.integration.server_flags import on_cpu

    if on_cpu(server_args):
        return
    if (SSDConfig.from_env() or SSDConfig()).verify_cuda_graph:
        logger.info(
            "SSD: decode CUDA graphs kept for the verify (--ssd-verify-cuda-graph): TARGET_VERIFY "
            "of %s tokens per request",
            getattr(server_args, "speculative_num_draft_tokens", None),
        )
        return
    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        Phase,
        default_cuda_graph_config,
        with_phase,
    )

    current = getattr(server_args, "cuda_graph_config", None) or default_cuda_graph_config()
    if current.decode.backend == Backend.DISABLED:
        return
    server_args.cuda_graph_config = with_phase(current, Phase.DECODE, backend=Backend.DISABLED)
    logger.info(
        "SSD: decode CUDA graphs off (was %s): SSD's TARGET_VERIFY forwards carry no custom "
        "mask for a captured graph to replay with, so they run eagerly",
        current.decode.backend,
    )


def refuse_plain_rounds_off_cpu(server_args: ServerArgs) -> None:
    """Refuse at startup `--ssd-mode plain` on a non-CPU target (`worker.round_mode.mode_refusal`
    says why).

    Raises:
        ValueError: naming the flag, the device and the reason.
    """
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.integration.server_flags import on_cpu
    from sglang_ssd.worker.round_mode import mode_refusal

    config = SSDConfig.from_env() or SSDConfig()
    device = "cpu" if on_cpu(server_args) else str(server_args.device or "cuda")
    refusal = mode_refusal(config.mode, device)
    if refusal is not None:
        raise ValueError(refusal)


def refuse_verify_cuda_graph(server_args: ServerArgs) -> None:
    """Refuse at startup `--ssd-verify-cuda-graph` where SGLang cannot replay SSD's verify
    (`verify_graphs.verify_cuda_graph_refusal`: the CPU, an EAGLE-3 head draft, another
    attention backend).

    Raises:
        ValueError: naming the flag and the reason.
    """
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.integration.server_flags import on_cpu
    from sglang_ssd.integration.verify_graphs import verify_cuda_graph_refusal
    from sglang_ssd.runtime_registry import AUTO, HEAD_RUNTIME

    config = SSDConfig.from_env() or SSDConfig()
    if not config.verify_cuda_graph:
        return
    head = config.draft_runtime == HEAD_RUNTIME
    if config.draft_runtime == AUTO and server_args.speculative_draft_model_path:
        from sglang_ssd.eagle3.config import is_eagle3_head

        head = is_eagle3_head(server_args.speculative_draft_model_path)
    refusal = verify_cuda_graph_refusal(server_args, on_cpu(server_args), head)
    if refusal is not None:
        raise ValueError(refusal)


def check_gpu_placement(server_args: ServerArgs, device_count: int | None = None) -> None:
    """On CUDA, refuse at startup a speculator GPU that collides with a target rank's or does
    not exist, for every DP replica (`placement.draft_gpu`; `device_count` defaults to the
    visible GPUs). Nothing to check on the CPU or with `--ssd-draft-device cpu`.

    Raises:
        ValueError: naming `--ssd-draft-device` and the GPUs involved.
    """
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.integration.server_flags import on_cpu
    from sglang_ssd.launch.placement import TargetGpus, draft_gpu

    config = SSDConfig.from_env() or SSDConfig()
    if on_cpu(server_args) or config.draft_device == "cpu":
        return
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    gpus = TargetGpus.of(server_args)
    for dp_rank in range(gpus.dp_size):
        draft_gpu(config, gpus, dp_rank, device_count)


def check_cpu_placement(server_args: ServerArgs, environ: dict[str, str] | None = None) -> None:
    """On CPU with `--dp-size` > 1, give every replica its own cores before SGLang starts
    them: check `SGLANG_CPU_OMP_THREADS_BIND` when set, else set it in `environ` (default
    `os.environ`, which SGLang's subprocesses inherit) to equal blocks of the available cores
    (`replica_cpus.plan_bind`; logged). Nothing to do on GPU or with one replica.

    Raises:
        ValueError: too few cores, overlapping or missing bind entries, or
            `--ssd-draft-cpus` with several replicas; the message names the flags.
    """
    import os

    from sglang_ssd.config import SSDConfig
    from sglang_ssd.integration.server_flags import on_cpu
    from sglang_ssd.launch import placement
    from sglang_ssd.launch.placement import TargetGpus
    from sglang_ssd.launch.replica_cpus import BIND_ENV, plan_bind

    gpus = TargetGpus.of(server_args)
    if not on_cpu(server_args) or gpus.dp_size == 1:
        return
    environ = os.environ if environ is None else environ
    config = SSDConfig.from_env() or SSDConfig()
    replicas = [gpus.replica(rank) for rank in range(gpus.dp_size)]
    bind = plan_bind(
        replicas,
        config.draft_cpus,
        config.allow_shared_cores,
        environ,
        placement.available_cpus(),
        placement.machine_cpus(),
    )
    if bind is not None:
        environ[BIND_ENV] = bind
        logger.info("SSD: %d DP replicas on CPU: %s=%s", gpus.dp_size, BIND_ENV, bind)


def validate_ssd_server_args(server_args: ServerArgs) -> None:
    """Refuse what SSD cannot serve, with a clear message (server flags: `server_flags.FLAGS`;
    an SGLang release other than the supported one: `sglang_version`).

    Raises:
        ValueError: naming the flag and why (or both SGLang versions).
    """
    from sglang_ssd.integration.sglang_version import check_sglang_version

    check_sglang_version()
    cfg = server_args  # SGLang passes a recorder that reads through the resolving view
    if cfg.speculative_draft_model_path is None:
        raise ValueError("--speculative-algorithm SSD needs --speculative-draft-model-path")
    steps = cfg.speculative_num_steps
    if steps is not None and steps < 1:
        raise ValueError(f"--speculative-num-steps must be >= 1 for SSD, got {steps}")
    if cfg.speculative_eagle_topk not in (None, 1):
        raise ValueError("SSD drafts a chain: --speculative-eagle-topk must be 1")
    from sglang_ssd.integration.server_flags import refuse_unsupported_flags

    refuse_unsupported_flags(cfg)
    refuse_plain_rounds_off_cpu(cfg)
    refuse_verify_cuda_graph(cfg)
    check_gpu_placement(cfg)
    check_cpu_placement(cfg)
    preferred = getattr(cfg, "preferred_sampling_params", None)
    if preferred:
        from sglang_ssd.integration.request_checks import sampling_refusal

        if isinstance(preferred, str):
            preferred = json.loads(preferred)
        reason = sampling_refusal(preferred)
        if reason is not None:
            raise ValueError(f"--preferred-sampling-params: {reason}")
    from sglang_ssd.integration.tokenizer_check import check_shared_tokenizer

    # Last: the cheap refusals above answer first; this one may load both tokenizers.
    check_shared_tokenizer(
        getattr(cfg, "tokenizer_path", None) or cfg.model_path,
        cfg.speculative_draft_model_path,
        bool(getattr(cfg, "trust_remote_code", False)),
    )
