"""eval.margin: replies aligned teacher-forced, chains resumed, ε by its rule (no servers)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from eval.datasets import Prompt, Record
from eval.margin.chains import Chain, make_chains, restore_all, save
from eval.margin.eps import FACTOR, fill_fp32_margins, summarize
from eval.margin.measure import Budget, Measurer
from eval.margin.segments import Differing, Reply, align, request_body


def _response(
    ids: Sequence[int],
    gaps: Sequence[float],
    finish: str = "length",
    seconds: Sequence[int] | None = None,
) -> dict:
    """A `/generate` reply as SGLang shapes it (top logprobs as [logprob, id, text])."""
    second = seconds or [(t + 1) % 1000 for t in ids]
    tops = [
        [[-0.1, t, None], [-0.1 - g, s, None]] for t, g, s in zip(ids, gaps, second, strict=True)
    ]
    return {
        "output_ids": list(ids),
        "meta_info": {"output_top_logprobs": tops, "finish_reason": {"type": finish}},
    }


def _reply(
    ids: Sequence[int], gaps: Sequence[float] | None = None, finish: str = "length"
) -> Reply:
    return Reply.from_response(_response(ids, gaps or [1.0] * len(ids), finish))


def test_reply_parses_sglangs_top_logprobs() -> None:
    r = Reply.from_response(_response([5, 6], [0.5, 0.25], "stop", [9, 8]))
    assert r.output_ids == (5, 6) and r.top_ids == ((5, 9), (6, 8))
    assert r.gaps == pytest.approx((0.5, 0.25)) and r.finish == "stop"
    with pytest.raises(ValueError, match="top logprobs"):
        Reply.from_response({"output_ids": [1, 2], "meta_info": {"output_top_logprobs": [[]]}})


def test_request_asks_for_greedy_top2_logprobs() -> None:
    body = request_body([1, 2], 16)
    assert body["return_logprob"] and body["top_logprobs_num"] == 2
    assert body["sampling_params"]["max_new_tokens"] == 16
    assert body["sampling_params"]["temperature"] == 0.0


def test_align_measures_positions_1_to_the_first_divergence() -> None:
    ar = _reply([1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5])
    ssd = _reply([1, 2, 3, 9, 9], [0.0, 0.21, 0.31, 0.05, 0.0])
    seg = align(10, ar, ssd)
    # Position 0 is the prefill's (EXTEND on both servers): left out.
    assert seg.decode_gap == pytest.approx((0.2, 0.3, 0.4))
    assert seg.verify_gap == pytest.approx((0.21, 0.31, 0.05))
    assert seg.differing == (Differing(13, 4, 9, pytest.approx(0.4), pytest.approx(0.05)),)
    # AR's token at the divergence is forced: both servers continue from the same context.
    assert seg.appended == (1, 2, 3, 4) and not seg.done and seg.reason == "diverged"


def test_an_exact_tie_listed_in_another_order_is_not_a_differing_argmax() -> None:
    ar = _reply([1, 2, 3], [1.0, 0.125, 1.0])
    tie = _response([1, 2, 3], [1.0, 0.0, 1.0])
    tie["meta_info"]["output_top_logprobs"][1].reverse()  # top-k put the other tied id first
    seg = align(0, ar, Reply.from_response(tie))
    assert seg.differing == () and seg.tie_orders == 1 and seg.positions == 2


def test_resume_takes_divergences_from_diverged_segments_not_from_ties(tmp_path: Path) -> None:
    chain = Chain(_prompt(0), True)
    chain.add(align(0, _reply([1, 2, 3, 4]), _reply([1, 2, 9, 9])), max_tokens=100)
    chain.add(align(3, _reply([5, 6, 7, 8]), _reply([5, 6, 7, 8])), max_tokens=100)
    chain.add(align(7, _reply([4, 4, 4]), _reply([4, 4, 5])), max_tokens=100)
    # What the first version recorded: a tie in another order (index 4) as differing, and not
    # the divergence at 9, where a tie made both top-1 ids equal.
    chain.differing = [
        chain.differing[0],
        {"index": 4, "decode": 6, "verify": 8, "decode_gap": 0.1, "verify_gap": 0.0},
    ]
    path = tmp_path / "m.json"
    save(path, {}, [chain])
    fresh = make_chains([_prompt(0)], [])
    restore_all(fresh, path)
    assert [(d["index"], d["decode"], d["verify"]) for d in fresh[0].differing] == [
        (2, 3, 9),
        (9, 4, -1),
    ]
    assert fresh[0].tie_orders == 1
    assert fresh[0].context(9) == [100, 200, 1, 2, 3, 5, 6, 7, 8, 4, 4]


def test_align_without_divergence_goes_on_after_length_and_stops_at_eos() -> None:
    seg = align(0, _reply([1, 2, 3]), _reply([1, 2, 3]))
    assert seg.positions == 2 and seg.appended == (1, 2, 3) and not seg.done
    stop = align(0, _reply([1, 2, 3], finish="stop"), _reply([1, 2, 3], finish="stop"))
    assert stop.done and stop.reason == "stop"
    # AR stopped exactly where they diverged: nothing after its EOS to measure.
    assert align(0, _reply([1, 2], finish="stop"), _reply([1, 7, 8])).done
    mismatch = align(0, _reply([1, 2], finish="stop"), _reply([1, 2, 3]))
    assert mismatch.done and mismatch.reason == "length-mismatch"


def _prompt(i: int) -> Prompt:
    return Prompt(Record("humaneval", f"HumanEval/{i}", "x"), (100 + i, 200 + i))


def test_chain_context_and_resume(tmp_path: Path) -> None:
    chain = Chain(_prompt(0), True)
    chain.add(align(0, _reply([1, 2, 3, 4]), _reply([1, 2, 9, 9])), max_tokens=100)
    assert chain.forced == [1, 2, 3] and chain.positions == 2
    assert chain.context(2) == [100, 200, 1, 2]
    path = tmp_path / "m.json"
    save(path, {"kind": "margin-eps", "date": "d1"}, [chain, Chain(_prompt(1), True)])
    fresh = make_chains([_prompt(0), _prompt(1)], [])
    assert restore_all(fresh, path) == (1, [{"date": "d1"}])
    save(path, {"date": "d2", "earlier_runs": [{"date": "d1"}]}, fresh)
    assert restore_all(make_chains([_prompt(0)], []), path)[1] == [{"date": "d1"}, {"date": "d2"}]
    assert fresh[0].forced == chain.forced and fresh[0].differing == chain.differing
    other = Chain(Prompt(Record("humaneval", "HumanEval/0", "x"), (7,)), True)
    with pytest.raises(ValueError, match="other prompt tokens"):
        restore_all([other], path)


def test_chain_is_done_at_the_token_cap() -> None:
    chain = Chain(_prompt(0), True)
    chain.add(align(0, _reply([1, 2, 3]), _reply([1, 2, 3])), max_tokens=3)
    assert chain.done


class FakeServers:
    """AR and SSD 'servers': greedy next token = f(context); SSD flips where f says so."""

    def __init__(self, flip_every: int = 7) -> None:
        self.flip_every = flip_every
        self.requests = 0

    def ask(self, url: str, ids: list[int], n: int) -> Reply:
        self.requests += 1
        ctx, out, gaps, second = list(ids), [], [], []
        for _ in range(n):
            t = (ctx[-1] * 3 + len(ctx)) % 97
            flip = url == "ssd" and len(ctx) % self.flip_every == 0
            out.append(t + 1 if flip else t)
            second.append(t if flip else t + 1)
            gaps.append(0.01 if flip else 1.0 + len(ctx) % 5)
            ctx.append(out[-1])
        return Reply.from_response(_response(out, gaps, "length", second))


def test_measurer_reaches_the_position_budget_teacher_forced() -> None:
    chains = make_chains([_prompt(i) for i in range(4)], [_prompt(9)])
    fake, saves = FakeServers(), []
    budget = Budget(positions=150, deadline=time.time() + 60, segment_tokens=16, max_tokens=64)
    Measurer("ar", "ssd", chains, budget, lambda: saves.append(1), fake.ask).run(streams=3)
    total = sum(c.positions for c in chains)
    assert 150 <= total < 150 + 3 * 16
    assert len(saves) == fake.requests // 2
    for c in chains:
        for d in c.differing:
            # Each differing position's context is the prompt plus the forced tokens before it.
            assert len(c.context(d["index"])) % fake.flip_every == 0


def test_eps_is_one_and_a_half_times_the_largest_fp32_margin_where_argmaxes_differ() -> None:
    chains = make_chains([_prompt(i) for i in range(3)], [])
    budget = Budget(positions=10**6, deadline=time.time() + 60, segment_tokens=8, max_tokens=32)
    Measurer("ar", "ssd", chains, budget, lambda: None, FakeServers().ask).run(streams=2)
    seen: list[list[int]] = []

    def margins(model: Path, contexts: Sequence[Sequence[int]]) -> list[float]:
        seen.extend(list(c) for c in contexts)
        return [0.01 * (i + 1) for i in range(len(contexts))]

    n = fill_fp32_margins(chains, Path("m"), margins)
    assert n == sum(len(c.differing) for c in chains) > 0
    assert fill_fp32_margins(chains, Path("m"), margins) == 0  # resumable: computed once
    summary = summarize(chains, min_positions=50)
    assert summary["eps"] == pytest.approx(FACTOR * 0.01 * n)
    assert summary["complete"] and summary["differing_count"] == n
    json.dumps(summary)


def test_without_differing_positions_eps_falls_back_to_the_gap_change() -> None:
    chains = make_chains([_prompt(0)], [])
    chains[0].add(align(0, _reply([1, 2, 3], [1, 1.0, 2.0]), _reply([1, 2, 3], [1, 1.1, 1.7])), 99)
    summary = summarize(chains, min_positions=10)
    assert summary["eps"] == pytest.approx(FACTOR * 0.3)
    assert summary["largest_gap_change"]["index"] == 2 and not summary["complete"]
