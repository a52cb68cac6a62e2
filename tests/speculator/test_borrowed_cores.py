"""A Step whose drafts need forwards runs them on the target's cores too; one served from the
cache does not; the speculator is back on its own cores before the Drafts go out."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.placement import widened
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.transport import Open, Outcome, SamplingSpec, Step
from tests.speculator.queued_link import QueuedLink

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]
GREEDY = SamplingSpec(temperature=0.0, top_k=1, top_p=1.0)
CPUS = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CPUS) < 2, reason="needs two cores")


class LazyLink(QueuedLink):
    """A queued link whose callable entries are made into messages when received."""

    def recv(self, timeout_s: float):
        if self.inbox and callable(self.inbox[0]):
            self.inbox[0] = self.inbox[0]()
        return super().recv(timeout_s)


@pytest.fixture
def restored_affinity():
    threads = torch.get_num_threads()
    yield
    os.sched_setaffinity(0, CPUS)
    torch.set_num_threads(threads)


@needs_two_cores
def test_widened_pins_wider_within_the_block_and_back_after(restored_affinity):
    own, extra = CPUS[-1:], CPUS[:1]
    os.sched_setaffinity(0, own)
    with pytest.raises(RuntimeError), widened(own, extra):
        assert sorted(os.sched_getaffinity(0)) == sorted(own + extra)
        assert torch.get_num_threads() == 2
        raise RuntimeError("the block fails")
    assert sorted(os.sched_getaffinity(0)) == own and torch.get_num_threads() == 1
    with widened(own, own):  # nothing to add: nothing changes
        assert sorted(os.sched_getaffinity(0)) == own


@needs_two_cores
def test_steps_that_run_forwards_borrow_the_targets_cores(tiny_draft, restored_affinity):
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=6), seed=0)
    seen: list[tuple[list[int], str]] = []
    serve = engine.serve

    def recording_serve(rids, backup, depth):
        drafts = serve(rids, backup, depth)
        seen.append((sorted(os.sched_getaffinity(0)), drafts[0].source))
        return drafts

    engine.serve = recording_serve  # type: ignore[method-assign]

    def cached_outcome() -> Step:
        branches = engine.requests["r"].branches
        assert branches is not None
        hit = Outcome(rid="r", accept_len=branches.ks[0], bonus=branches.bonus[0])
        return Step(step_id=2, outcomes=[hit], requests=["r"], backup="jit")

    link = LazyLink(
        engine,
        [
            Open(rid="r", token_ids=PROMPT, sampling=GREEDY, prespeculate=False),
            Step(step_id=1, outcomes=[], requests=["r"], backup="jit"),  # prefill + jit
            cached_outcome,  # a hit: the build after step 1 cached it
            Step(
                step_id=3,
                outcomes=[Outcome(rid="r", accept_len=0, bonus=6)],
                requests=["r"],
                backup="ngram",
            ),
        ],
    )
    own, target = CPUS[-1:], CPUS[:1]
    os.sched_setaffinity(0, own)
    torch.set_num_threads(1)
    server = SpeculatorServer(link, engine, os.getppid(), own_cpus=own, borrow_cpus=target)
    server.run()
    assert not link.sent, link.sent
    wide = sorted(own + target)
    # Step 1: a prefill and a jit draft; step 2: a hit served without forwards; step 3: a
    # miss drafted by n-gram.
    assert seen == [(wide, "jit"), (own, "cache"), (own, "ngram")]
    assert sorted(os.sched_getaffinity(0)) == own  # pinned back before each reply
    assert server.counters["borrowed_steps"] == 1


def test_on_a_gpu_or_without_target_cores_nothing_is_borrowed(tiny_draft):
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=256)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=4), seed=0)
    server = SpeculatorServer(QueuedLink(engine, []), engine, os.getppid(), (), CPUS)
    assert server.borrow_cpus == ()
