"""The speculator's round by phase: every Drafts carries the seconds by phase since
the previous one, the phases name each forward of the round, and they add up to the round's
time (none counted twice: phases cannot nest; none missing: what no phase claims is `*_other`)."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from sglang_ssd.phases import PhaseTimer, device_sync, largest
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.transport import Open, Outcome, SamplingSpec, Step
from tests.speculator.queued_link import QueuedLink
from tests.speculator.test_engine_pool import PROMPT, _engine

GREEDY = SamplingSpec(temperature=0.0, top_k=1, top_p=1.0)


def test_each_drafts_names_the_rounds_phases_and_they_add_up(tiny_draft) -> None:
    engine = _engine(tiny_draft, tree_depth=3)
    link = QueuedLink(
        engine,
        [
            Open(rid="r", token_ids=PROMPT, sampling=GREEDY, prespeculate=False),
            Step(step_id=1, outcomes=[], requests=["r"], backup="jit"),
            Step(
                step_id=2,
                outcomes=[Outcome(rid="r", accept_len=1, bonus=7)],
                requests=["r"],
                backup="jit",
            ),
        ],
    )
    server = SpeculatorServer(link, engine, parent_pid=os.getppid())
    server.run()
    assert not link.sent, link.sent
    (first, _), (second, _) = link.replies
    assert {"prefill", "jit", "lm_head", "sampling", "serve_other"} <= set(first.timing.phases)
    phases = second.timing.phases
    # The first round's pack, send and pre-speculation (glue + one forward per tree depth),
    # then the second Step's outcome lookup and draft.
    built = {"glue", "tree_1", "tree_2", "tree_3", "populate", "build_other", "pack", "send"}
    assert built | {"lookup", "lm_head", "sampling", "serve_other"} <= set(phases)
    assert "tree_4" not in phases
    timing = second.timing
    total = sum(phases.values())
    assert total >= timing.build_s + timing.backup_s
    assert total <= timing.build_s + timing.lookup_s + timing.backup_s + phases["pack"] + 1e-4
    # Measured once: `/ssd/stats`' totals are the Steps' own seconds summed.
    stats = server.stats()
    assert stats.steps == 2 and first.timing.build_s == 0.0  # no build before Step 1
    for name in ("lookup_s", "backup_s"):
        assert getattr(stats, name) == getattr(first.timing, name) + getattr(second.timing, name)
    assert stats.build_s > second.timing.build_s > 0  # Step 2's build is not reported yet
    assert stats.open_requests == 1 and stats.kv_slots_used == engine.num_used_slots() > 0


def test_the_step_sets_the_depth_of_the_build_after_it(tiny_draft) -> None:
    """Step.tree_depth (the target's self-tuned D) overrides the configured depth (γ = 4 here)
    for the pre-speculation that follows that Step; 0 leaves the configured one."""
    engine = _engine(tiny_draft)
    outcome = [Outcome(rid="r", accept_len=0, bonus=7)]
    link = QueuedLink(
        engine,
        [
            Open(rid="r", token_ids=PROMPT, sampling=GREEDY, prespeculate=False),
            Step(step_id=1, outcomes=[], requests=["r"], backup="jit", tree_depth=2),
            Step(step_id=2, outcomes=outcome, requests=["r"], backup="jit"),
            Step(step_id=3, outcomes=[], requests=["r"], backup="jit"),
        ],
    )
    SpeculatorServer(link, engine, parent_pid=os.getppid()).run()
    (_, _), (second, _), (third, _) = link.replies
    assert {"tree_1", "tree_2"} <= set(second.timing.phases)
    assert "tree_3" not in second.timing.phases
    assert "tree_4" in third.timing.phases


def test_a_step_without_prespeculation_builds_nothing_after_it(tiny_draft) -> None:
    """Step.prespeculate False (a sync round): the drafts are served, no build follows, so the
    next Step misses the cache and its draft is just in time again; True builds again (a
    Drafts' timing covers the build after the Step before it)."""
    engine = _engine(tiny_draft)
    outcome = [Outcome(rid="r", accept_len=0, bonus=7)]
    messages = [Open(rid="r", token_ids=PROMPT, sampling=GREEDY, prespeculate=False)]
    for step_id, prespeculate in ((1, False), (2, False), (3, True), (4, True)):
        outcomes = outcome if step_id > 1 else []
        step = Step(step_id=step_id, outcomes=outcomes, requests=["r"], backup="jit",
                    prespeculate=prespeculate)  # fmt: skip
        messages.append(step)
    SpeculatorServer(link := QueuedLink(engine, messages), engine, parent_pid=os.getppid()).run()
    timings = [drafts.timing for drafts, _ in link.replies]
    assert [t.build_forwards for t in timings] == [0, 0, 0, timings[3].build_forwards]
    assert timings[3].build_forwards > 0 and "tree_1" in timings[3].phases
    assert [d.entries[0].source for d, _ in link.replies[:3]] == ["jit"] * 3  # no cache to hit


def test_phase_timer_totals_means_and_the_log_summary() -> None:
    timer = PhaseTimer()
    with timer.phase("glue"):
        pass
    timer.add("tree_1", 0.5)
    timer.merge({"tree_1": 0.25, "lm_head": 0.125})
    assert timer.calls["tree_1"] == 2
    means = timer.means(rounds=2)
    assert means["tree_1"] == pytest.approx(0.375) and means["lm_head"] == pytest.approx(0.0625)
    assert largest(means, 2) == "tree_1 375.0 ms, lm_head 62.5 ms"
    nested = pytest.raises(RuntimeError, match="inside phase 'glue'")
    with timer.phase("glue"), nested, timer.phase("lm_head"):
        pass
    taken = timer.take()
    assert taken["tree_1"] == pytest.approx(0.75) and timer.seconds == {} and timer.calls == {}


def test_a_device_timer_synchronises_at_every_phase_boundary() -> None:
    """On CUDA a phase must hold the GPU work it launched: the timer calls
    its sync before each clock read, at entry and at exit, and a CPU timer has none."""
    events: list[str] = []
    timer = PhaseTimer(sync=lambda: events.append("sync"))
    with timer.phase("forward"):
        events.append("work")
    with pytest.raises(ValueError), timer.phase("verify"):
        raise ValueError
    assert events == ["sync", "work", "sync", "sync", "sync"]
    assert set(timer.calls) == {"forward", "verify"}
    assert PhaseTimer.for_device("cpu").sync is None
    assert device_sync(torch.device("cpu")) is None
    sync = device_sync("cuda:1")
    assert isinstance(sync, functools.partial) and sync.func is torch.cuda.synchronize
    assert sync.args == (torch.device("cuda", 1),)
    assert PhaseTimer.for_device("cuda:1").sync.args == sync.args
