"""A tensor-parallel target (`--tp-size` 2, tp_size > 1) with one speculator: TP rank 0 plans and
verifies, rank 1 follows its broadcasts (`sglang_ssd.worker.tp_sync`).

Two real processes on a gloo group (the CPU group SGLang gives the TP ranks), running three
rounds as `SSDWorker` does: a mixed batch (cache hit with q at depth D < γ, just-in-time with q,
n-gram, random and target-side n-gram rows) verified at mixed temperatures; a round where rank
0's speculator times out and its own n-gram drafts serve; a plain round. Rank 1's planning and
verification raise if they are ever called, so it can only hold what rank 0 sent.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import SamplingBatch
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.planner import RoundPlanner
from sglang_ssd.worker.round_mode import Arrangement, RoundMode
from sglang_ssd.worker.tp_sync import (
    SOURCES,
    RoundPlan,
    TpGroup,
    pack_plan,
    plan_size,
    share_outcome,
    share_plan,
    unpack_plan,
)
from sglang_ssd.worker.verify_step import VerifiedBatch, verify_batch

GAMMA = 4
W = GAMMA + 1
V = 32
ROUNDS = ("mixed", "timeout", "plain")


def mixed_drafts() -> DraftBatch:
    """Five rows, one per source; rows 0-1 carry q (row 0 a hit at depth 3 < γ)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (5, GAMMA), generator=gen)
    tokens[0, 3] = -1
    q = torch.zeros(5, GAMMA, V)
    q[:2] = torch.softmax(torch.randn(2, GAMMA, V, generator=gen), dim=-1)
    return DraftBatch(
        tokens=tokens,
        depth=torch.tensor([3, 4, 4, 4, 4]),
        q=q,
        has_q=torch.tensor([True, True, False, False, False]),
        sources=["cache", "jit", "ngram", "random", "local-ngram"],
    )


def mixed_sampling() -> SamplingBatch:
    """Rows 0 and 2 greedy, the others at T 0.7-1.2 with top-k / top-p."""
    return SamplingBatch(
        temperature=torch.tensor([0.0, 0.7, 0.0, 1.2, 1.0]),
        top_k=torch.tensor([1, 20, 1, -1, 8]),
        top_p=torch.tensor([1.0, 0.9, 1.0, 1.0, 0.95]),
    )


def requests(n: int) -> list[Any]:
    """SGLang-like requests whose tokens repeat a pattern (n-gram drafts continue it)."""
    return [
        SimpleNamespace(rid=f"r{i}", origin_input_ids=[1, 2, 3, 4 + i] * 3, output_ids=[1, 2])
        for i in range(n)
    ]


class FakeSupervisor:
    """A linked speculator that never answers: `SpeculatorClient.drafts` times out on it."""

    def __init__(self) -> None:
        self.faults: list[str] = []

    def usable(self) -> bool:
        return True

    def fault(self, reason: str) -> None:
        self.faults.append(reason)


def timing_out_client() -> Any:
    """The real `SpeculatorClient.drafts` decision path, over a speculator that times out."""
    from sglang_ssd.transport import TransportError
    from sglang_ssd.worker.draft_provider import LocalNgramProvider
    from sglang_ssd.worker.speculator_client import SpeculatorClient

    client = object.__new__(SpeculatorClient)
    client.lock = threading.Lock()
    client.supervisor = FakeSupervisor()
    client.local = LocalNgramProvider(GAMMA)

    def no_drafts(reqs: Any, planner: Any) -> DraftBatch:
        raise TransportError("no drafts within 0.5 s")

    client._remote_drafts = no_drafts
    return client


def _never(what: str) -> Any:
    def fail() -> Any:
        raise AssertionError(f"a follower rank called its own {what}")

    return fail


def _record(plan: RoundPlan, verified: VerifiedBatch) -> dict[str, Any]:
    d = plan.drafts
    return {
        "mode": plan.mode.value,
        "arrangement": plan.arrangement.value,
        "tokens": d.tokens,
        "depth": d.depth,
        "has_q": d.has_q,
        "sources": list(d.sources),
        "q_here": d.q is not None,
        "accept_len": verified.accept_len,
        "bonus": verified.bonus,
        "predict": verified.predict,
        "accept_index": verified.accept_index,
    }


def greedy(b: int) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.zeros(b), top_k=torch.ones(b, dtype=torch.int64), top_p=torch.ones(b)
    )


def _scenario(name: str, leader: bool, out: dict[str, Any]) -> tuple[int, Any, SamplingBatch]:
    """(B, rank 0's planning, the batch's sampling) of round `name`."""
    if name == "mixed":
        # A sync round: rank 0's arrangement reaches the other ranks with the drafts.
        return 5, lambda: RoundPlan(Arrangement.SYNC, mixed_drafts()), mixed_sampling()
    if name == "timeout":
        client = timing_out_client() if leader else None
        if leader:
            out["faults"] = client.supervisor.faults
        planner = RoundPlanner(SSDConfig(lookahead=GAMMA))

        def decide() -> RoundPlan:
            return RoundPlan(Arrangement.ASYNC, client.drafts(requests(3), planner))

        return 3, decide, greedy(3)
    sampling = SamplingBatch(
        temperature=torch.ones(3), top_k=torch.full((3,), -1), top_p=torch.ones(3)
    )
    return 3, lambda: RoundPlan(Arrangement.PLAIN, DraftBatch.plain(3)), sampling


def _round(tp: TpGroup, name: str, out: dict[str, Any]) -> None:
    """One decode round of `name` as `SSDWorker._decode` runs it on this rank."""
    gen = torch.Generator().manual_seed(7)
    b, decide, sampling = _scenario(name, tp.leader, out)
    plan = share_plan(tp, b, GAMMA, decide if tp.leader else _never("planning"))
    width = 1 if plan.mode == RoundMode.PLAIN else W
    # Rank 0's logits are the target's (every TP rank has them after the gathered LM head);
    # rank 1's verify is never run, so its own logits could be anything.
    logits = torch.randn(b, width, V, generator=gen) * 3
    if width > 1:  # the target agrees with each draft's first two tokens
        first = plan.drafts.tokens[:, :2].clamp(min=0)
        logits.scatter_add_(2, first.unsqueeze(2), torch.full((b, 2, 1), 12.0))
    logits = logits.reshape(b * width, V)

    def verify() -> VerifiedBatch:
        return verify_batch(logits, plan.drafts, sampling, width, gen)

    verified = share_outcome(tp, plan.drafts, width, verify if tp.leader else _never("verify"))
    out[name] = _record(plan, verified)


def rank_main(rank: int, port: int, out_dir: str) -> None:
    """One TP rank: a gloo TP group of 2 (SGLang's `tp_group.cpu_group`), three rounds."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    tp = TpGroup(group=dist.new_group([0, 1], backend="gloo"), rank=rank, size=2)
    out: dict[str, Any] = {}
    for name in ROUNDS:
        _round(tp, name, out)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both ranks' records of the three rounds (rank 0's, rank 1's)."""
    out = tmp_path_factory.mktemp("tp")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, str(out)), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed (see its traceback above)"
    return tuple(torch.load(out / f"rank{r}.pt") for r in (0, 1))  # type: ignore[return-value]


def _same(a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), key
        else:
            assert x == y, key


DRAFT_KEYS = ("mode", "arrangement", "tokens", "depth", "has_q", "sources")
OUTCOME_KEYS = ("accept_len", "bonus", "predict", "accept_index")


def test_rank1_forwards_exactly_rank0s_mixed_drafts(ranks) -> None:
    lead, follow = (r["mixed"] for r in ranks)
    _same(lead, follow, DRAFT_KEYS)
    assert follow["arrangement"] == "sync"
    assert lead["sources"] == ["cache", "jit", "ngram", "random", "local-ngram"]
    assert lead["tokens"].shape == (5, GAMMA) and int(lead["tokens"][0, 3]) == -1
    assert lead["q_here"] and not follow["q_here"]  # q stays where verify runs


def test_rank1_commits_exactly_rank0s_verify_outcome(ranks) -> None:
    lead, follow = ranks
    for name in ROUNDS:
        _same(lead[name], follow[name], OUTCOME_KEYS)
    # Not a trivial outcome: the mixed round accepts some tokens and rejects some.
    k = lead["mixed"]["accept_len"]
    assert int(k.max()) > 0 and bool((k < lead["mixed"]["depth"]).any())


def test_rank0s_timeout_fallback_is_what_rank1_forwards(ranks) -> None:
    lead, follow = (r["timeout"] for r in ranks)
    _same(lead, follow, DRAFT_KEYS)
    assert follow["sources"] == ["local-ngram"] * 3
    assert follow["tokens"][:, 0].tolist() == [3, 3, 3]  # ... 1 2 | 3: n-gram continues 1 2 3
    assert len(ranks[0]["faults"]) == 1 and "no drafts within" in ranks[0]["faults"][0]
    assert "faults" not in ranks[1]  # rank 1 has no client, so nothing to fault


def test_rank0s_plain_round_is_plain_on_rank1(ranks) -> None:
    lead, follow = (r["plain"] for r in ranks)
    _same(lead, follow, DRAFT_KEYS + OUTCOME_KEYS)
    assert follow["mode"] == "plain" and follow["tokens"].shape == (3, 0)
    assert follow["accept_len"].tolist() == [0, 0, 0]


def test_a_plan_packs_and_unpacks_exactly() -> None:
    drafts = mixed_drafts()
    payload = pack_plan(RoundPlan(Arrangement.ASYNC, drafts), GAMMA)
    assert payload.dtype == torch.uint8 and payload.shape == (plan_size(5, GAMMA),)
    plan = unpack_plan(payload, 5, GAMMA)
    assert plan.mode == RoundMode.SPECULATE and plan.drafts.q is None
    for key in ("tokens", "depth", "has_q"):
        assert torch.equal(getattr(plan.drafts, key), getattr(drafts, key)), key
    assert plan.drafts.sources == drafts.sources
    shallow = DraftBatch(drafts.tokens[:, :2], drafts.depth.clamp(max=2), None, drafts.has_q,
                         drafts.sources)  # fmt: skip
    assert torch.equal(
        unpack_plan(
            pack_plan(RoundPlan(Arrangement.ASYNC, shallow), GAMMA), 5, GAMMA
        ).drafts.tokens,
        shallow.tokens,
    )


def test_unshareable_plans_and_corrupt_payloads_are_refused() -> None:
    drafts = mixed_drafts()
    with pytest.raises(ValueError, match="exceed the lookahead"):
        pack_plan(RoundPlan(Arrangement.ASYNC, drafts), GAMMA - 1)
    missing = DraftBatch(drafts.tokens, drafts.depth, None, drafts.has_q, ["missing"] * 5)
    with pytest.raises(ValueError, match="cannot be shared"):
        pack_plan(RoundPlan(Arrangement.ASYNC, missing), GAMMA)
    payload = pack_plan(RoundPlan(Arrangement.ASYNC, drafts), GAMMA)
    with pytest.raises(ValueError, match="for a batch of 4"):
        unpack_plan(payload, 4, GAMMA)
    for corrupt in (b"ngram", b"async", None):  # a source, the arrangement, row 0's tokens
        bad = payload.clone()
        raw = bytes(bad.tolist())
        if corrupt is not None:  # one letter of a name: no longer a known source or arrangement
            bad[raw.index(corrupt)] = ord("X")
        else:  # row 0's token list (after its depth, has_q and source) made a string
            bad[raw.index(b"cache") + 5] = 0xA1
        with pytest.raises(ValueError, match="corrupt plan broadcast"):
            unpack_plan(bad, 5, GAMMA)
    bad = payload.clone()
    bad[:4] = 255  # a length past the payload
    with pytest.raises(ValueError, match="out of range"):
        unpack_plan(bad, 5, GAMMA)


def test_the_plan_bound_holds_the_largest_plan() -> None:
    """Tokens at the id ceiling, the longest source name, depth γ: still within `plan_size`."""
    b = 7
    longest = max(SOURCES, key=len)
    drafts = DraftBatch(
        tokens=torch.full((b, GAMMA), 2**31 - 1), depth=torch.full((b,), GAMMA), q=None,
        has_q=torch.ones(b, dtype=torch.bool), sources=[longest] * b,
    )  # fmt: skip
    plan = unpack_plan(pack_plan(RoundPlan(Arrangement.ASYNC, drafts), GAMMA), b, GAMMA)
    assert torch.equal(plan.drafts.tokens, drafts.tokens) and plan.drafts.sources == [longest] * b
