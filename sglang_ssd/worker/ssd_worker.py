"""The target side of SSD inside SGLang's scheduler: `SSDWorker`.

Per decode round (DESIGN.md §1–2): ask the `RoundPlanner` what the round does, obtain each
request's draft from the `SpeculatorClient` (the speculator process's drafts, or the target's
own n-gram drafts while it is down), run one
TARGET_VERIFY forward of the target over γ + 1 chain positions, verify with
`sglang_ssd.saguaro.verify` only (never SGLang's EAGLE verify, which is greedy on CPU), and
hand SGLang's spec-v2 scheduler the accepted tokens; the outcomes go to the speculator with
the next round's request. Prefill batches run the target as usual.

With `--tp-size N` only TP rank 0 holds the `SpeculatorClient`, its `SpeculatorAdmin` and the
`RoundPlanner` (one speculator per TP group): it plans each round and verifies, and the other
ranks follow its broadcasts (`tp_sync`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_device, get_parallel, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

from sglang_ssd.config import SSDConfig, TargetCapacity
from sglang_ssd.eagle3.config import head_feature_layers
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.placement import TargetGpus
from sglang_ssd.saguaro import SamplingBatch, filter_order
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.feature_buffer import extend_features, verify_features
from sglang_ssd.worker.metrics import RoundTimer, count_request_rounds
from sglang_ssd.worker.planner import RoundPlanner
from sglang_ssd.worker.request_options import shape_verify_logits
from sglang_ssd.worker.round_mode import RoundMode, record_request_tokens
from sglang_ssd.worker.speculator_admin import SpeculatorAdmin, speculator_config
from sglang_ssd.worker.speculator_client import SpeculatorClient
from sglang_ssd.worker.tp_sync import RoundPlan, TpGroup, share_outcome, share_plan
from sglang_ssd.worker.verify_input import SSDVerifyInput, build_verify_input
from sglang_ssd.worker.verify_step import VerifiedBatch, verify_batch, verify_tokens

logger = logging.getLogger(__name__)


class SSDWorker(BaseSpecWorker):
    """SGLang spec worker for `--speculative-algorithm SSD` (constructed by the scheduler)."""

    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ) -> None:
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.gpu_id = gpu_id
        self.device = get_device().device
        spec = get_spec()
        self.speculative_num_steps = spec.speculative_num_steps
        self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
        self.topk = 1
        self.width = self.speculative_num_draft_tokens
        if self.width != self.speculative_num_steps + 1:
            raise ValueError("SSD needs --speculative-num-draft-tokens = γ + 1")
        config = SSDConfig.from_env() or SSDConfig(lookahead=self.speculative_num_steps)
        if config.lookahead != self.speculative_num_steps:
            config = config.replace(lookahead=self.speculative_num_steps)
        self.config = config
        seed = server_args.random_seed if server_args.random_seed is not None else 0
        self.generator = torch.Generator(device=self.device).manual_seed(seed + 7919)
        self.draft_model_path = spec.speculative_draft_model_path
        # An EAGLE-3 head draft reads the target's features (`eagle3_capture` made the model
        # capture them): every target forward returns them (FULL) and they go to the speculator.
        self.ships_features, _ = head_feature_layers(self.draft_model_path)
        self.tp = _tp_group()  # None with one TP rank: no broadcasts at all
        self.dp_rank = _dp_rank()  # this scheduler's DP replica: its own speculator and socket
        # Started by `alloc_memory_pool`, once the target's capacity (which sizes the
        # speculator's KV pool) is known; None on TP ranks other than 0 (they follow rank 0).
        self.speculator_client: SpeculatorClient | None = None
        self.speculator_admin: SpeculatorAdmin | None = None  # live settings and counters
        self.planner: RoundPlanner | None = None  # each round's mode, backup and tree depth
        # Phases synchronise the target's device at their boundaries on CUDA (GPU time).
        self.timer = RoundTimer(phases=PhaseTimer.for_device(self.device))  # speculative rounds
        # Plain rounds (no draft, cores lent).
        self.plain_timer = RoundTimer(phases=PhaseTimer.for_device(self.device))
        self._last_decode_end: float | None = None
        self._gap_s = 0.0  # the latest scheduler time between two decode rounds
        self._last_mode: RoundMode | None = None

    # ------------------------------------------------------------ SGLang plumbing
    @property
    def draft_worker(self) -> None:
        return None

    @property
    def leads(self) -> bool:
        """Whether this rank drives the speculator (the only rank, or TP rank 0)."""
        return self.tp is None or self.tp.leader

    def alloc_memory_pool(self, **kwargs: Any) -> None:
        """Share the target's pools, then (on the leading rank only) start the speculator sized
        from the target's."""
        self.req_to_token_pool, self.token_to_kv_pool_allocator = (
            self._target_worker.get_memory_pool()
        )
        if not self.leads:
            return
        runner = self.model_runner
        device = str(self.device)
        capacity = TargetCapacity(
            max_total_tokens=int(runner.max_total_num_tokens),
            max_running_requests=int(runner.max_running_requests),
            context_len=int(runner.model_config.context_len),
        )
        self.planner = RoundPlanner(self.config)
        self.speculator_client = SpeculatorClient(
            speculator_config(self.config, capacity),
            draft_model_path=self.draft_model_path,
            # SGLang's device is "cuda" (the scheduler set the current device to its gpu_id).
            target_device=f"cuda:{self.gpu_id}" if device == "cuda" else device,
            vocab_size=runner.model_config.vocab_size,
            gpus=TargetGpus.of(self.server_args),
            dp_rank=self.dp_rank,
            target_model_path=self.server_args.model_path,
        )
        self.speculator_admin = SpeculatorAdmin(
            self.speculator_client, capacity, on_configure=self.planner.apply
        )

    def clear_cache_pool(self) -> None:
        if self.speculator_client is not None:
            self.speculator_client.reset()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        if self.speculator_client is not None:
            self.speculator_client.close(rid)

    # ------------------------------------------------------------ forward
    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish: Any = None, **kwargs: Any
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_decode():
            return self._decode(batch, on_publish)
        return self._extend(batch, on_publish)

    def _extend(self, batch: ScheduleBatch, on_publish: Any) -> GenerationBatchResult:
        self._last_decode_end = None  # the gap to the next decode round holds this prefill
        client = self.speculator_client
        if client is not None:
            client.prepare(batch.reqs)
        with self._cores(self.planner is not None and self.planner.plain_now):
            result = self._target_worker.forward_batch_generation(batch, **self._capture())
        if client is not None and self.ships_features:
            rows = extend_features(
                result.logits_output.hidden_states, batch.prefix_lens, batch.extend_lens
            )
            client.add_features([req.rid for req in batch.reqs], rows)
        bs = len(batch.reqs)
        predict = result.next_token_ids
        accept_tokens = torch.zeros(bs, self.width, dtype=torch.int32, device=self.device)
        if bs:
            accept_tokens[:, 0] = predict
        accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        new_seq_lens = batch.seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)
        return self._result(
            result.logits_output,
            next_token_ids=predict,
            accept_tokens=accept_tokens.flatten(),
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            can_run_cuda_graph=result.can_run_cuda_graph,
        )

    def _decode(self, batch: ScheduleBatch, on_publish: Any) -> GenerationBatchResult:
        """One decode round, speculative or plain (the `RoundPlanner` decides): drafts (none in a
        plain round), one TARGET_VERIFY forward over W positions per request (γ + 1; 1 in a
        plain round, with the speculator's cores lent to the target), verification, KV moves
        of the accepted tokens, bookkeeping. Each step is timed as a phase of the round timer
        (`wait_draft`, `build_batch`, `forward`, `verify`, `commit`, `record`, and
        `scheduler`: the time SGLang spent between two decode rounds); plain rounds have their
        own timer (`self.plain_timer`)."""
        t_start = time.perf_counter()
        if self._last_decode_end is not None:
            self._gap_s = t_start - self._last_decode_end
        bs = len(batch.reqs)
        plan = self._plan(batch)
        mode, drafts = plan.mode, plan.drafts
        plain = mode == RoundMode.PLAIN
        timer = self.plain_timer if plain else self.timer
        phases = timer.phases
        if self._last_decode_end is not None:
            phases.add("scheduler", self._gap_s)
        width = 1 if plain else self.width
        t_drafts = time.perf_counter()
        phases.add("wait_draft", t_drafts - t_start)
        with phases.phase("build_batch"):
            seq_lens, verify_ids = self._build_verify_batch(batch, drafts, width)
        with phases.phase("forward"), self._cores(plain):
            result = self._target_worker.forward_batch_generation(
                batch, is_verify=True, **self._capture()
            )
        logits_output = result.logits_output
        t_forward = time.perf_counter()
        with phases.phase("verify"):
            shape_verify_logits(batch, logits_output.next_token_logits, verify_ids, drafts.tokens)
            verified = self._verify(batch, logits_output.next_token_logits, drafts, width)
        with phases.phase("commit"):
            accept_lens, accept_index, predict = self._commit(batch, logits_output, verified)
            new_seq_lens = seq_lens + accept_lens
            if on_publish is not None:
                on_publish(new_seq_lens)
        with phases.phase("record"):
            self._record_round(batch, drafts, verified, (t_start, t_drafts, t_forward), timer)
            self._ship_features(batch, logits_output, seq_lens, verified, width)
        batch.forward_mode = ForwardMode.DECODE
        # SGLang reads each request's first accept_len tokens at stride self.width.
        accept_tokens = torch.nn.functional.pad(
            predict[accept_index].view(bs, width), (0, self.width - width)
        ).flatten()
        self._last_decode_end = time.perf_counter()
        self._measure_round(batch, mode, verified, self._last_decode_end - t_start + self._gap_s)
        return self._result(
            logits_output,
            next_token_ids=accept_tokens,
            accept_tokens=accept_tokens,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            can_run_cuda_graph=False,
        )

    def _capture(self) -> dict[str, Any]:
        """The target forward's keyword for an EAGLE-3 head draft: capture FULL, so that
        `logits_output.hidden_states` holds every position's features (`eagle3_capture`)."""
        return {"capture_hidden_mode": CaptureHiddenMode.FULL} if self.ships_features else {}

    def _ship_features(
        self,
        batch: ScheduleBatch,
        logits_output: Any,
        seq_lens: torch.Tensor,
        verified: VerifiedBatch,
        width: int,
    ) -> None:
        """An EAGLE-3 head draft's features of the positions this round committed (root and
        accepted tokens; the bonus token's come next round) to the speculator client."""
        if self.speculator_client is None or not self.ships_features:
            return
        rows = verify_features(
            logits_output.hidden_states,
            seq_lens.tolist(),
            verified.accept_len.tolist(),
            width,
        )
        self.speculator_client.add_features([req.rid for req in batch.reqs], rows)

    def _plan(self, batch: ScheduleBatch) -> RoundPlan:
        """The round's mode and drafts: decided here with one rank; with TP, on rank 0 and
        broadcast (`tp_sync.share_plan`), so every rank forwards the same tokens."""
        if self.tp is None:
            return self._decide(batch)
        return share_plan(
            self.tp, len(batch.reqs), self.speculative_num_steps, lambda: self._decide(batch)
        )

    def _decide(self, batch: ScheduleBatch) -> RoundPlan:
        """The leading rank's plan: the planner's mode, then the speculator client's drafts
        for the Step the planner shapes (its own n-gram drafts after a timeout or fault), none
        in a plain round.

        Raises:
            RuntimeError: on a rank without the planner (a follower plans nothing).
        """
        planner, client = self.planner, self.speculator_client
        if planner is None or client is None:
            raise RuntimeError("only the leading TP rank plans SSD rounds")
        mode = planner.plan(batch.reqs)
        if mode == RoundMode.PLAIN:
            return RoundPlan(mode, DraftBatch.plain(len(batch.reqs)))
        return RoundPlan(mode, client.drafts(batch.reqs, planner))

    def _verify(
        self, batch: ScheduleBatch, logits: torch.Tensor, drafts: DraftBatch, width: int
    ) -> VerifiedBatch:
        """`verify_batch` here with one rank; with TP on rank 0 only, its outcome broadcast
        (`tp_sync.share_outcome`), so every rank commits the same tokens."""

        def verify() -> VerifiedBatch:
            sampling = _sampling_of(batch, self.server_args.sampling_backend)
            return verify_batch(logits, drafts, sampling, width, self.generator)

        if self.tp is None:
            return verify()
        return share_outcome(self.tp, drafts, width, verify)

    def _measure_round(
        self, batch: ScheduleBatch, mode: RoundMode, verified: VerifiedBatch, round_s: float
    ) -> None:
        """Round time to the planner, tokens to each request's L_r; a speculative
        round right after plain ones is not measured (it pays the switch: a cold cache)."""
        cold = mode == RoundMode.SPECULATE and self._last_mode == RoundMode.PLAIN
        self._last_mode = mode
        if cold:
            return
        if self.planner is not None:
            self.planner.observe_round_time(mode, len(batch.reqs), round_s)
        if mode == RoundMode.SPECULATE:
            for req, k in zip(batch.reqs, verified.accept_len.tolist(), strict=True):
                record_request_tokens(req, k + 1)

    def _cores(self, plain: bool) -> contextlib.AbstractContextManager[None]:
        """A plain round's forward runs on the speculator's cores too (`cores_lent`), and so
        does a prefill while plain rounds are the mode in use (on the leading rank: the
        speculator runs beside it)."""
        if plain and self.speculator_client is not None:
            return self.speculator_client.supervisor.cores_lent()
        return contextlib.nullcontext()

    def _build_verify_batch(
        self, batch: ScheduleBatch, drafts: DraftBatch, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn the decode `batch` into a TARGET_VERIFY batch over [root, d_1 .. d_{W-1}] per
        request, with KV slots for all W = `width` positions; returns the seq lens before the
        round and the verify tokens (int64 [B, W] on the CPU)."""
        bs = len(batch.reqs)
        roots = [
            req.output_ids[-1] if len(req.output_ids) else req.origin_input_ids[-1]
            for req in batch.reqs
        ]
        verify_ids = verify_tokens(roots, drafts, width)
        input_ids = verify_ids.reshape(-1).to(self.device)
        seq_lens = batch.seq_lens
        positions = (
            seq_lens.to(torch.int64).unsqueeze(1)
            + torch.arange(width, device=seq_lens.device).unsqueeze(0)
        ).reshape(-1)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = input_ids
        batch.out_cache_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=seq_lens,
            end_offset=seq_lens + width,
            batch_size=bs,
            draft_token_num=width,
            device=self.device,
        )
        batch.spec_info = build_verify_input(
            input_ids, positions, seq_lens, batch.seq_lens_cpu, width
        )
        return seq_lens, verify_ids

    def _commit(
        self, batch: ScheduleBatch, logits_output: Any, verified: VerifiedBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keep the accepted tokens' KV (and their logprobs when asked); returns SGLang's
        (accept_lens int32 [B], accept_index int64 [B, W], predict int64 [B * W]) on the
        target's device."""
        accept_lens = verified.accept_lens_with_bonus.to(self.device)
        accept_index = verified.accept_index.to(self.device)
        predict = verified.predict.to(self.device)
        move_accept_tokens_to_target_kvcache(
            batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator
        )
        if batch.return_logprob:
            from sglang.srt.layers.logprob_processor import compute_spec_logprobs

            compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)
        return accept_lens, accept_index, predict

    def _record_round(
        self,
        batch: ScheduleBatch,
        drafts: DraftBatch,
        verified: VerifiedBatch,
        times: tuple[float, float, float],
        timer: RoundTimer,
    ) -> None:
        """Outcomes to the speculator and the planner (speculative rounds only: a plain round's
        tokens reach the speculator with the next Step), the round's timers and per-request
        source counts; `times` are perf_counter seconds at the round's start, drafts in hand,
        forward done."""
        t_start, t_drafts, t_forward = times
        client, planner = self.speculator_client, self.planner
        if timer is self.timer and client is not None and planner is not None and batch.reqs:
            accept_lens = verified.accept_len.tolist()
            client.record_outcomes(
                [req.rid for req in batch.reqs], accept_lens, verified.bonus.tolist()
            )
            planner.observe_outcomes(drafts, accept_lens, t_forward - t_drafts, client.last_timing)
        timer.record(
            batch_size=len(batch.reqs),
            wait_draft_s=t_drafts - t_start,
            verify_s=time.perf_counter() - t_drafts,
            forward_s=t_forward - t_drafts,
            accept_len=verified.accept_len,
            sources=drafts.sources,
        )
        count_request_rounds(batch.reqs, drafts.sources)

    def _result(
        self,
        logits_output: Any,
        *,
        next_token_ids: torch.Tensor,
        accept_tokens: torch.Tensor,
        accept_lens: torch.Tensor,
        new_seq_lens: torch.Tensor,
        can_run_cuda_graph: bool,
    ) -> GenerationBatchResult:
        """The round as SGLang's spec-v2 scheduler takes it (`accept_tokens` flat, stride W)."""
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=can_run_cuda_graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=SSDVerifyInput(
                draft_token_num=self.width,
                new_seq_lens=new_seq_lens,
                accept_tokens=accept_tokens,
                accept_lens=accept_lens,
            ),
            speculative_num_draft_tokens=self.width,
        )


def _tp_group() -> TpGroup | None:
    """The target's TP group (its CPU group: SGLang's `tp_group.cpu_group`), None with one
    rank."""
    group = get_parallel().tp_group
    if group.world_size == 1:
        return None
    return TpGroup(group=group.cpu_group, rank=group.rank_in_group, size=group.world_size)


def _dp_rank() -> int:
    """This scheduler's DP replica (SGLang's `dp_rank`; 0 without `--dp-size` > 1)."""
    rank = get_parallel().dp_rank
    return 0 if rank is None else int(rank)


def _sampling_of(batch: ScheduleBatch, sampling_backend: str) -> SamplingBatch:
    """The target's p parameters of this batch, as SGLang's sampler with `sampling_backend`
    (`--sampling-backend`, resolved by SGLang) applies them: its filter order depends on the
    backend and on whether any request of the batch needs min-p (`saguaro.filter_order`)."""
    info = batch.sampling_info
    return SamplingBatch(
        temperature=info.temperatures.reshape(-1).float().cpu(),
        top_k=info.top_ks.reshape(-1).cpu(),
        top_p=info.top_ps.reshape(-1).float().cpu(),
        min_p=info.min_ps.reshape(-1).float().cpu() if info.need_min_p_sampling else None,
        filter_order=filter_order(sampling_backend, bool(info.need_min_p_sampling)),
    )
