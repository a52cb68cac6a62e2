"""The target side of SSD inside SGLang's scheduler: `SSDWorker`.

Per decode round (docs/architecture.md, "One decode round"): ask the `RoundPlanner` what the
round does, obtain each request's draft from the `SpeculatorClient` (the speculator process's
drafts, or the target's own n-gram drafts while it is down), run one TARGET_VERIFY forward of
the target over γ + 1 chain positions, verify with `sglang_ssd.saguaro.verify` only (never
SGLang's EAGLE verify, which is greedy on CPU), and hand SGLang's spec-v2 scheduler the accepted
tokens; the outcomes go to the speculator with the next round's request. Prefill batches run the
target as usual.

With `--tp-size N` only TP rank 0 holds the `SpeculatorClient`, its `SpeculatorAdmin` and the
`RoundPlanner` (one speculator per TP group): it plans each round and verifies, and the other
ranks follow its broadcasts (`tp_sync`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_device, get_parallel, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

from sglang_ssd.config import SSDConfig, TargetCapacity
from sglang_ssd.eagle3.config import head_feature_layers
from sglang_ssd.launch.placement import TargetGpus
from sglang_ssd.saguaro import SamplingBatch, filter_order
from sglang_ssd.worker.metrics import (
    FORWARD_PHASES,
    RoundClock,
    RoundTimer,
    count_request_rounds,
)
from sglang_ssd.worker.planner import RoundPlanner
from sglang_ssd.worker.request_options import shape_verify_logits
from sglang_ssd.worker.round_mode import RoundMode
from sglang_ssd.worker.round_observers import FeatureShipper, RoundObserver
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
        # capture them): its observer asks every forward for them and ships them.
        ships_features, _ = head_feature_layers(self.draft_model_path)
        self.features = FeatureShipper() if ships_features else None
        self.observers: list[RoundObserver] = [self.features] if self.features else []
        self.forward_kwargs: dict[str, Any] = {}
        for observer in self.observers:
            self.forward_kwargs.update(observer.forward_kwargs)
        self.tp = _tp_group()  # None with one TP rank: no broadcasts at all
        self.dp_rank = _dp_rank()  # this scheduler's DP replica: its own speculator and socket
        # Started by `alloc_memory_pool`, once the target's capacity (which sizes the
        # speculator's KV pool) is known; None on TP ranks other than 0 (they follow rank 0).
        self.speculator_client: SpeculatorClient | None = None
        self.speculator_admin: SpeculatorAdmin | None = None  # live settings and counters
        self.planner: RoundPlanner | None = None  # each round's arrangement, backup, depth
        # Phases synchronise the target's device at their boundaries on CUDA (GPU time).
        self.clock = RoundClock(self.device)
        self.timers = {mode: RoundTimer() for mode in RoundMode}  # totals by round mode
        self.timer = self.timers[RoundMode.SPECULATE]  # read by /ssd/stats and the log line
        self.plain_timer = self.timers[RoundMode.PLAIN]

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
        self.planner = RoundPlanner(self.config, device)
        logger.info(
            "SSD: settings in force (* settable at run time, POST /ssd/config): %s",
            self.config.flags_line(),
        )
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
        if self.features is not None:
            self.features.sink = self.speculator_client
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
        self.clock.prefill()  # the gap to the next decode round holds this prefill
        client, planner = self.speculator_client, self.planner
        if client is not None and planner is not None:
            client.prepare(batch.reqs, planner.prespeculates(len(batch.reqs)))
        new_tokens = int(batch.extend_num_tokens or 0)
        lend = planner is not None and planner.prefill_lends_cores(new_tokens, len(batch.reqs))
        with self._cores(lend):
            result = self._target_worker.forward_batch_generation(batch, **self.forward_kwargs)
        for observer in self.observers:
            observer.extended([req.rid for req in batch.reqs], result.logits_output, batch)
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
        """One decode round: plan (arrangement and drafts: `RoundPlanner`, TP rank 0's broadcast) →
        build the TARGET_VERIFY batch over W positions per request → the target's forward →
        verify (`saguaro`) → commit the accepted tokens' KV → record (outcomes, planner,
        observers) → SGLang's result. Each step is a phase of the round's clock; the phases go
        to the timer of the round's mode (`self.timers`)."""
        phases = self.clock.start()
        with phases.phase("wait_draft"):
            plan = self._plan(batch)
        with phases.phase("build_batch"):
            seq_lens, verify_ids = self._build_verify_batch(batch, plan)
        with phases.phase("forward"), self._cores(plan.lends_cores):
            logits_output = self._target_worker.forward_batch_generation(
                batch, is_verify=True, **self.forward_kwargs
            ).logits_output
        with phases.phase("verify"):
            verified = self._verify(batch, logits_output, verify_ids, plan)
        with phases.phase("commit"):
            committed = self._commit(batch, logits_output, verified, seq_lens, on_publish)
        with phases.phase("record"):
            self._record_round(batch, plan, logits_output, seq_lens, verified)
        self._record_timers(batch, plan, verified)
        return self._result(logits_output, can_run_cuda_graph=False, **committed)

    def _plan(self, batch: ScheduleBatch) -> RoundPlan:
        """The round's arrangement and drafts, from the planner with one rank; with TP, on rank 0
        and broadcast (`tp_sync.share_plan`), so every rank forwards the same tokens.

        Raises:
            RuntimeError: on the leading rank before the speculator client exists.
        """

        def decide() -> RoundPlan:
            if self.planner is None or self.speculator_client is None:
                raise RuntimeError("only the leading TP rank plans SSD rounds")
            return self.planner.plan_round(batch.reqs, self.speculator_client)

        if self.tp is None:
            return decide()
        return share_plan(self.tp, len(batch.reqs), self.speculative_num_steps, decide)

    def _verify(
        self, batch: ScheduleBatch, logits_output: Any, verify_ids: torch.Tensor, plan: RoundPlan
    ) -> VerifiedBatch:
        """SGLang's logit processing of the request options (`shape_verify_logits`), then
        `verify_batch` here with one rank; with TP on rank 0 only, its outcome broadcast
        (`tp_sync.share_outcome`), so every rank commits the same tokens."""
        logits = logits_output.next_token_logits
        shape_verify_logits(batch, logits, verify_ids, plan.drafts.tokens)
        width = plan.width(self.speculative_num_steps)

        def verify() -> VerifiedBatch:
            sampling = _sampling_of(batch, self.server_args.sampling_backend)
            return verify_batch(logits, plan.drafts, sampling, width, self.generator)

        if self.tp is None:
            return verify()
        return share_outcome(self.tp, plan.drafts, width, verify)

    def _cores(self, lend: bool) -> contextlib.AbstractContextManager[None]:
        """With `lend`, the block (a sync or plain round's forward; a prefill the planner lends
        cores to) runs on the speculator's cores too, the speculator stopped (`cores_lent`,
        leading rank only: the speculator runs beside it)."""
        if lend and self.speculator_client is not None:
            return self.speculator_client.supervisor.cores_lent()
        return contextlib.nullcontext()

    def _build_verify_batch(
        self, batch: ScheduleBatch, plan: RoundPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn the decode `batch` into a TARGET_VERIFY batch over [root, d_1 .. d_{W-1}] per
        request, with KV slots for all W positions (`plan.width`); returns the seq lens before
        the round and the verify tokens (int64 [B, W] on the CPU)."""
        bs = len(batch.reqs)
        width = plan.width(self.speculative_num_steps)
        roots = [
            req.output_ids[-1] if len(req.output_ids) else req.origin_input_ids[-1]
            for req in batch.reqs
        ]
        verify_ids = verify_tokens(roots, plan.drafts, width)
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
        self,
        batch: ScheduleBatch,
        logits_output: Any,
        verified: VerifiedBatch,
        seq_lens: torch.Tensor,
        on_publish: Any,
    ) -> dict[str, torch.Tensor]:
        """Keep the accepted tokens' KV (and their logprobs when asked), publish the new seq
        lens; returns `_result`'s tensors on the target's device: accept_lens int32 [B],
        new_seq_lens [B], and the accepted tokens int64 [B * γ+1] at stride γ + 1 (SGLang reads
        each request's first accept_len of them), as both next_token_ids and accept_tokens."""
        bs, width = len(batch.reqs), verified.accept_index.shape[1]
        accept_lens = verified.accept_lens_with_bonus.to(self.device)
        accept_index = verified.accept_index.to(self.device)
        predict = verified.predict.to(self.device)
        move_accept_tokens_to_target_kvcache(
            batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator
        )
        if batch.return_logprob:
            from sglang.srt.layers.logprob_processor import compute_spec_logprobs

            compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)
        new_seq_lens = seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        batch.forward_mode = ForwardMode.DECODE
        accept_tokens = torch.nn.functional.pad(
            predict[accept_index].view(bs, width), (0, self.width - width)
        ).flatten()
        return {
            "next_token_ids": accept_tokens,
            "accept_tokens": accept_tokens,
            "accept_lens": accept_lens,
            "new_seq_lens": new_seq_lens,
        }

    def _record_round(
        self,
        batch: ScheduleBatch,
        plan: RoundPlan,
        logits_output: Any,
        seq_lens: torch.Tensor,
        verified: VerifiedBatch,
    ) -> None:
        """The round's outcomes and measurements to the planner (leading rank:
        `RoundPlanner.close_round`, which sends a speculative round's outcomes to the client),
        what the round committed to the observers."""
        accept_lens = verified.accept_len.tolist()
        client, planner = self.speculator_client, self.planner
        if client is not None and planner is not None:
            outcome = (accept_lens, verified.bonus.tolist())
            verify_s = self.clock.spent(FORWARD_PHASES)
            planner.close_round(client, batch.reqs, plan, outcome, verify_s, self.clock.round_s())
        rids = [req.rid for req in batch.reqs]
        width = plan.width(self.speculative_num_steps)
        for observer in self.observers:
            observer.verified(rids, logits_output, seq_lens.tolist(), accept_lens, width)

    def _record_timers(
        self, batch: ScheduleBatch, plan: RoundPlan, verified: VerifiedBatch
    ) -> None:
        """The round's phases to its mode's timer; per-request draft-source counts."""
        self.timers[plan.mode].record(
            batch_size=len(batch.reqs),
            phases=self.clock.stop(),
            accept_len=verified.accept_len,
            sources=plan.drafts.sources,
        )
        count_request_rounds(batch.reqs, plan.drafts.sources)

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
    backend and on whether any request of the batch needs min-p (`saguaro.filter_order`).

    Built on the host from the requests' `sampling_params`, as SGLang builds its device copies
    (`SamplingBatchInfo.from_schedule_batch`: float32 temperature, top-p, min-p; int32 top-k,
    one row per request in batch order), so reading them costs no device sync."""
    info, params = batch.sampling_info, [req.sampling_params for req in batch.reqs]
    need_min_p = bool(info.need_min_p_sampling)
    return SamplingBatch(
        temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.int32),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
        min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32) if need_min_p else None,
        filter_order=filter_order(sampling_backend, need_min_p),
    )
