"""Host syncs per decode round, on both sides, against the budgets in `sglang_ssd.host_syncs`.

Counted with `HostSyncCounter` on the CPU (an upper bound on the CUDA syncs: every tensor here
is a host tensor; docs/cuda.md lists the budgets and what they hold).

- Target: `SSDWorker._decode` itself, with the real `SpeculatorClient`, `RoundPlanner` and a
  speculator (`tests/worker/test_link_faults.py`'s thread speculator over gloo) and the tiny
  target as an HF model for the verify forward. SGLang's own parts of the round are not ours to
  count and do not run here: its TARGET_VERIFY forward (the HF forward stands in, not counted),
  its KV-slot assignment, verify input and accepted-KV move (`assign_extend_cache_locs_func`,
  `build_verify_input`, `move_accept_tokens_to_target_kvcache`: no-ops here).
- Speculator: the engine's hit round (apply the outcomes that hit, serve, build), the model's
  phase syncs counted through its `PhaseTimer`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import sglang_ssd.worker.ssd_worker as ssd_worker
from sglang_ssd.host_syncs import SPECULATOR_ROUND_BUDGET, TARGET_ROUND_BUDGET, HostSyncCounter
from sglang_ssd.worker.metrics import VERIFY_PHASES, RoundClock, RoundTimer
from sglang_ssd.worker.round_mode import RoundMode
from tests.worker.test_link_faults import CONFIG, client, patched, planner  # noqa: F401

TEMPERATURES = [0.0, 0.8, 0.0]  # greedy and sampled rows: both verify paths


def test_the_counter_counts_reads_of_values_on_the_host() -> None:
    x = torch.arange(6)
    counter = HostSyncCounter()
    with counter:
        y = (x * 2 + 1)[torch.tensor([0, 2])]  # arithmetic, integer indexing: no read
        x.tolist(), x[0].item(), bool(x[1]), int(x[2]), x.cpu(), x.nonzero()
        x[x > 2], torch.where(x > 1), x.repeat_interleave(x)
        x.repeat_interleave(x, output_size=15)  # the size is given: no read
        with counter.paused():
            x.tolist()
        counter.device_sync()
    assert y.tolist() == [1, 5]
    expected = {"tolist": 1, "item": 1, "__bool__": 1, "__int__": 1, "cpu": 1, "nonzero": 1,
                "__getitem__": 1, "where": 1, "repeat_interleave": 1, "synchronize": 1}  # fmt: skip
    assert dict(counter.by_op) == expected
    assert all(site.startswith("test_host_syncs.py:") for site in counter.by_site)


class _HFTarget:
    """The target's verify forward as `TpModelWorker.forward_batch_generation` returns it: the
    logits at the W verified positions of each request (a full forward, no KV cache), not
    counted (SGLang's forward is not ours)."""

    def __init__(self, path: Path, counter: HostSyncCounter) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.counter = counter

    @torch.inference_mode()
    def forward_batch_generation(self, batch: Any, is_verify: bool, **_: Any) -> Any:
        assert is_verify
        with self.counter.paused():
            ids = batch.input_ids.view(len(batch.reqs), -1)  # [B, W]
            rows = []
            for req, verify_ids in zip(batch.reqs, ids, strict=True):
                before = req.origin_input_ids + req.output_ids[:-1]  # the root is verified
                seq = torch.tensor([before + verify_ids.tolist()])
                rows.append(self.model(input_ids=seq).logits[0, -ids.shape[1] :].float())
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=torch.cat(rows)))


def _worker(client, planner, target: _HFTarget, clock: RoundClock) -> ssd_worker.SSDWorker:  # noqa: F811
    """An `SSDWorker` as `__init__` and `alloc_memory_pool` wire it for one CPU rank."""
    worker = object.__new__(ssd_worker.SSDWorker)
    worker.__dict__.update(
        server_args=SimpleNamespace(sampling_backend="pytorch"),
        _target_worker=target,
        device=torch.device("cpu"),
        speculative_num_steps=CONFIG.lookahead,
        width=CONFIG.lookahead + 1,
        generator=torch.Generator().manual_seed(7919),
        observers=[],
        forward_kwargs={},
        tp=None,
        speculator_client=client,
        planner=planner,
        clock=clock,
        timers={mode: RoundTimer() for mode in RoundMode},
        token_to_kv_pool_allocator=None,
    )
    return worker


def _batch(reqs: list) -> Any:
    """The parts of SGLang's decode `ScheduleBatch` the round reads (its KV pools unused)."""
    seq_lens = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
    return SimpleNamespace(
        reqs=reqs,
        sampling_info=SimpleNamespace(need_min_p_sampling=False),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens,
        req_pool_indices=None,
        req_to_token_pool=SimpleNamespace(req_to_token=None),
        has_grammar=False,
        return_logprob=False,
    )


def _reqs(client) -> list:  # noqa: F811
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i, t in enumerate(TEMPERATURES):
        params = SamplingParams(temperature=t, max_new_tokens=200)
        params.normalize(None)
        reqs.append(
            SimpleNamespace(
                rid=f"s{i}",
                origin_input_ids=[40 + i, 71, 72, 73, 0, 5, 9],
                output_ids=[],
                sampling_params=params,
            )
        )
    client.prepare(reqs)
    for req in reqs:
        req.output_ids.append(9)  # the prefill's first token
    return reqs


def test_target_round_stays_within_its_host_sync_budget(
    client,  # noqa: F811
    planner,  # noqa: F811
    tiny_target: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("assign_extend_cache_locs_func", "move_accept_tokens_to_target_kvcache"):
        monkeypatch.setattr(ssd_worker, name, lambda *a, **k: None)  # SGLang's KV pools
    monkeypatch.setattr(ssd_worker, "build_verify_input", lambda *a, **k: None)
    counter = HostSyncCounter()
    clock = RoundClock("cpu", sample_every=4, sync=counter.device_sync)
    worker = _worker(client, planner, _HFTarget(tiny_target, counter), clock)
    reqs = _reqs(client)
    per_round: list[tuple[bool, int]] = []
    reports = []
    for _ in range(8):
        batch = _batch(reqs)
        counter.reset()
        with counter:
            result = worker._decode(batch, on_publish=None)
        per_round.append((clock.sampled, counter.total))
        reports.append(counter.report())
        width = result.next_token_ids.numel() // len(reqs)
        for b, (req, n) in enumerate(zip(reqs, result.accept_lens.tolist(), strict=True)):
            req.output_ids += result.next_token_ids[b * width : b * width + n].tolist()
    assert [sampled for sampled, _ in per_round] == [i % 4 == 0 for i in range(8)]
    sources = worker.timers[RoundMode.SPECULATE].sources
    assert sources["cache"] + sources["jit"] > 0, f"no speculator drafts: {dict(sources)}"
    phase_syncs = 2 * (len(VERIFY_PHASES) + 1)  # wait_draft's and the verify's, at both ends
    for i, (sampled, total) in enumerate(per_round[2:], start=2):  # after two warm-up rounds
        budget = TARGET_ROUND_BUDGET + (phase_syncs - 1 if sampled else 0)
        assert total <= budget, f"round {i}: {total} host syncs > {budget}:\n{reports[i]}"


def test_speculator_hit_round_stays_within_its_host_sync_budget(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    try:
        from ssd_round import LOOKAHEAD, Round, engine_on, make_pair, target_on
    finally:
        sys.path.pop(0)
    from sglang_ssd.speculator.engine import OutcomeIn

    draft, target = make_pair(tmp_path)
    run = Round(engine_on(draft, "cpu"), target_on(target, "cpu"), [0.0, 0.8])
    assert run.engine.model.kv_pool.debug, "the KV pool's debug checks are on in tests"
    run.engine.model.kv_pool.debug = False  # as served on CUDA (`kv_pool.default_debug`)
    counter = HostSyncCounter()
    run.engine.model.phases.sync = counter.device_sync  # what `PhaseTimer.for_device` does on CUDA
    run.open()
    run.step(torch.Generator().manual_seed(2))  # warm-up
    for _ in range(2):
        outcomes = []
        for rid in run.rids:
            branches = run.engine.requests[rid].branches
            outcomes.append(OutcomeIn(rid, branches.ks[0], branches.bonus[0]))
        counter.reset()
        with counter:
            run.engine.apply_outcomes(outcomes)
            run.engine.serve(run.rids, backup="jit", depth=LOOKAHEAD)
            run.engine.build(run.rids)
        assert {run.engine.requests[r].draft.source for r in run.rids} == {"cache"}
        assert counter.total <= SPECULATOR_ROUND_BUDGET, (
            f"{counter.total} host syncs > {SPECULATOR_ROUND_BUDGET}:\n{counter.report()}"
        )
