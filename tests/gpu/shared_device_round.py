"""Greedy SSD rounds with the speculator as its own process on the target's device, the target
in this process (no SGLang): `SpeculatorClient` starts the real speculator process (`python -m
sglang_ssd.speculator`), `RoundPlanner` plans each round, the target scores the drafts with a
full HF forward and `verify_step.verify_batch` verifies them.

On one GPU two things stand in the way of serving and are set aside here, for tests only:
placement refuses a speculator on one of the target's GPUs (`placement.draft_gpu`: NCCL refuses
two ranks on one device), and the link between two CUDA sides is NCCL
(`supervisor.link_backend`). `shared_device` places the speculator on the target's device and
makes the link gloo, which stages the draft tensors through host memory
(`tensor_link.TensorLink`: a CUDA tensor is copied to the host to send, received on the host,
and laid out on the target's device by `draft_batch.dense_q`).

Imports msgspec, pyzmq and psutil (through the worker's client) only when called.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ssd_round import PROMPTS, target_logits, target_on

LOOKAHEAD = 4
ROUNDS = 6


@contextmanager
def shared_device(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> Iterator[None]:
    """The test-only placement: the speculator on `device` beside the target, a gloo link."""
    import sglang_ssd.launch.placement as placement
    import sglang_ssd.worker.supervisor as supervisor

    if device.type == "cuda":
        monkeypatch.setattr(placement, "draft_gpu", lambda *args: str(device))
    else:
        monkeypatch.setattr(placement, "pin_process", lambda cpus: list(cpus))
    monkeypatch.setattr(supervisor, "link_backend", lambda *args: ("gloo", None))
    yield


def greedy_rounds(
    draft: Path, target: Path, device: torch.device, vocab: int
) -> tuple[dict[str, list[int]], list[list[str]], torch.nn.Module]:
    """`ROUNDS` greedy rounds of two requests; returns the tokens each emitted, the draft
    sources by round, and the target model (on `device`)."""
    from sglang_ssd.config import SSDConfig
    from sglang_ssd.saguaro import SamplingBatch
    from sglang_ssd.worker.planner import RoundPlanner
    from sglang_ssd.worker.speculator_admin import speculator_config
    from sglang_ssd.worker.speculator_client import SpeculatorClient
    from sglang_ssd.worker.verify_step import verify_batch, verify_tokens

    config = SSDConfig(lookahead=LOOKAHEAD, fanout_budget=4, backup="jit", speculator_timeout=60)
    model = target_on(target, device)
    client = SpeculatorClient(speculator_config(config, None), str(draft), str(device), vocab)
    planner = RoundPlanner(config)
    greedy = SimpleNamespace(
        temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, sampling_seed=None, max_new_tokens=None
    )
    reqs = [
        SimpleNamespace(rid=f"g{i}", origin_input_ids=p, output_ids=[], sampling_params=greedy)
        for i, p in enumerate(PROMPTS)
    ]
    emitted: dict[str, list[int]] = {r.rid: [] for r in reqs}
    sources = []
    try:
        client.prepare(reqs)
        for req in reqs:  # the prefill's token: the target's argmax after the prompt
            first = int(target_logits(model, req.origin_input_ids, 0)[0, -1].argmax())
            req.output_ids.append(first)
            emitted[req.rid].append(first)
        for _ in range(ROUNDS):
            plan = planner.plan_round(reqs, client)
            width = plan.width(LOOKAHEAD)
            roots = [r.output_ids[-1] for r in reqs]
            ids = verify_tokens(roots, plan.drafts, width)
            logits = torch.cat(
                [
                    target_logits(model, r.origin_input_ids + r.output_ids[:-1] + row, width - 1)
                    for r, row in zip(reqs, ids.tolist(), strict=True)
                ]
            ).reshape(len(reqs) * width, -1)
            sampling = SamplingBatch.from_lists([0.0] * len(reqs), [1] * len(reqs))
            verified = verify_batch(logits, plan.drafts, sampling, width)
            accept, bonus = verified.accept_len.tolist(), verified.bonus.tolist()
            for r, row, k, t in zip(reqs, ids.tolist(), accept, bonus, strict=True):
                r.output_ids += [*row[1 : 1 + k], t]
                emitted[r.rid] += [*row[1 : 1 + k], t]
            client.record_outcomes([r.rid for r in reqs], accept, bonus)
            sources.append(plan.drafts.sources)
    finally:
        client.shutdown()
    return emitted, sources, model


def first_divergence_from_ar(
    model: torch.nn.Module, emitted: dict[str, list[int]], margin: float
) -> list[tuple[str, int, float]]:
    """Check each request's tokens against the target's own greedy continuation (AR by the
    same full forwards): equal, or the first difference at a top-2 logit margin below `margin`
    (a near-tie that forward shapes may flip). Returns those near-ties."""
    ties = []
    for (rid, tokens), prompt in zip(emitted.items(), PROMPTS, strict=False):
        ar: list[int] = []
        for i, token in enumerate(tokens):
            logits = target_logits(model, prompt + ar, 0)[0, -1]
            ar.append(int(logits.argmax()))
            if ar[i] != token:
                top = logits.topk(2).values
                gap = float(top[0] - top[1])
                assert gap < margin, f"{rid}: token {i} SSD {token} vs AR {ar[i]}, margin {gap}"
                ties.append((rid, i, gap))
                break
    return ties
