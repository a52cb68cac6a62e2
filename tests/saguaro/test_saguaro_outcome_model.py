"""The outcome model: P(k, t) from the draft's probabilities, calibration, the budgeted choice."""

from __future__ import annotations

import itertools

import pytest
import torch

from sglang_ssd.saguaro.outcome_model import (
    Calibration,
    DraftEvidence,
    OutcomeModel,
    bonus_features,
    select_outcomes,
)


def _evidence(token_probs: list[float], width: int = 6, greedy: bool = True) -> DraftEvidence:
    """A greedy-looking draft: d_j is the top candidate of row j-1 (prob `token_probs[j-1]`),
    the other candidates share the rest geometrically; row D is flat-ish."""
    depth = len(token_probs)
    cands = torch.stack([torch.arange(width) + 10 * k for k in range(depth + 1)])
    probs = torch.zeros(depth + 1, width)
    for k in range(depth + 1):
        top = token_probs[k] if k < depth else 0.5
        rest = torch.tensor([0.5**i for i in range(1, width)])
        probs[k] = torch.cat([torch.tensor([top]), (1 - top) * rest / rest.sum() * 0.9])
    tokens = cands[:depth, 0].clone()
    return DraftEvidence(tokens, cands, probs, torch.tensor(token_probs), None, greedy)


def test_select_outcomes_takes_the_most_probable_within_the_budget() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(3, 5, 4, generator=gen)
    probs[1, 3:] = 0.0  # request 1 drafted only 2 tokens: k = 3, 4 are not outcomes
    probs[2, :, 2:] = 0.0  # and request 2 has only two candidates per row
    for budget in (0, 1, 3, 7, 30):
        own = select_outcomes(probs, budget, shared=False)
        for i in range(3):
            chosen = set(own[i].flatten().nonzero().flatten().tolist())
            possible = [j for j in range(20) if probs[i].flatten()[j] > 0]
            best = sorted(possible, key=lambda j: -probs[i].flatten()[j])[:budget]
            assert chosen == set(best)
            assert len(chosen) <= budget
        shared = select_outcomes(probs, budget, shared=True)
        assert int(shared.sum()) == min(3 * budget, int((probs > 0).sum()))
        assert not bool((shared & (probs == 0)).any())
        if shared.any() and not shared.all():
            assert probs[shared].min() >= probs[~shared].max()


def test_outcome_probs_follow_the_draft_confidence() -> None:
    model = OutcomeModel()
    confident = model.outcome_probs(_evidence([0.97, 0.97, 0.97, 0.97]))
    hesitant = model.outcome_probs(_evidence([0.97, 0.3, 0.97, 0.97]))
    assert confident.shape == (5, 6)
    p_k = confident.sum(-1)
    assert int(p_k.argmax()) == 4  # confident everywhere: most mass on "all accepted"
    assert hesitant.sum(-1)[:2].sum() > hesitant.sum(-1)[2:].sum()  # falls at k <= 1
    # the rejected draft token is never an outcome at k < D
    assert bool((confident[:4, 0] == 0).all()) and bool((confident[4] > 0).any())


@pytest.mark.parametrize("budget", [1, 4, 8, 13])
def test_allocation_respects_budget_and_depth(budget: int) -> None:
    model = OutcomeModel()
    drafts = [_evidence([0.9, 0.8, 0.6, 0.9]), _evidence([0.4, 0.9]), _evidence([])]
    counts = model.allocate(drafts, budget, shared=True)
    assert counts.shape == (3, 5)
    assert int(counts.sum()) == min(
        3 * budget, sum(int(bonus_features(e)[1].sum()) for e in drafts)
    )
    assert int(counts[1, 3:].sum()) == 0 and int(counts[2, 1:].sum()) == 0  # k <= D only
    own = model.allocate(drafts, budget, shared=False)
    assert (own.sum(-1) <= budget).all()
    # the chosen set is the top of the brute-force ranking of every request's P(k, t)
    ranked = sorted(
        ((float(p), i) for i, e in enumerate(drafts) for p in model.outcome_probs(e).flatten()),
        reverse=True,
    )
    ranked = [x for x in ranked if x[0] > 0][: 3 * budget]
    per_request = [sum(1 for _, i in ranked if i == r) for r in range(3)]
    assert counts.sum(-1).tolist() == per_request


def test_calibration_converges_on_synthetic_outcomes() -> None:
    gen = torch.Generator().manual_seed(1)
    cal = Calibration()
    truth = lambda x: x**2  # noqa: E731  (the draft is over-confident)
    for _ in range(40):
        x = torch.rand(500, generator=gen)
        cal.observe(x, torch.rand(500, generator=gen) < truth(x))
    centres = (torch.arange(cal.num_buckets) + 0.5) / cal.num_buckets
    assert torch.allclose(cal.predict(centres), truth(centres).float(), atol=0.05)
    assert bool((cal.rates().diff() >= 0).all())  # monotone
    assert float(cal.trials.sum()) <= 20_000.0 + 500  # halved to follow drift


def test_acceptance_is_calibrated_from_verified_outcomes() -> None:
    model = OutcomeModel()
    gen = torch.Generator().manual_seed(2)
    e = _evidence([0.9, 0.9, 0.9])
    before = model.outcome_probs(e).sum(-1)
    for _ in range(3000):  # the target accepts a 0.9-confident token half of the time
        k = 0
        while k < 3 and float(torch.rand(1, generator=gen)) < 0.5:
            k += 1
        model.observe(e, k, int(e.candidates[k, 1]))
    after = model.outcome_probs(e).sum(-1)
    assert float(before[3]) > 0.6 and float(after[3]) < 0.2
    assert model.greedy.accept.predict(torch.tensor([0.9])).item() == pytest.approx(0.5, abs=0.05)
    # the bonus was always the second candidate: its rate rose, the sampled maps are untouched
    assert model.greedy.bonus_rejected.trials.sum() > 0
    assert float(model.sampled.accept.trials.sum()) == 0.0
    with pytest.raises(ValueError):
        model.observe(e, 4, 0)


def test_sampled_bonus_follows_saguaro_residual() -> None:
    """With β < 1 the residual max(p - q, 0) sits on the down-weighted top tokens: the bonus
    feature is their share of it; with q = p (β = 1) it falls back to p without d_{k+1}."""
    e = _evidence([0.5], width=4, greedy=False)
    p = e.probs[0]
    q = p.clone()
    q[:2] *= 0.5  # top 2 (d_1 and the first alternative) down-weighted
    q = q / q.sum() * p.sum()
    e.q_cands = q.view(1, -1)
    x, valid = bonus_features(e)
    assert x[0, 1] == pytest.approx(1.0) and float(x[0, 2:].sum()) == 0.0
    e.q_cands = p.view(1, -1).clone()
    x, _ = bonus_features(e)
    assert x[0, 1] == pytest.approx(float(p[1] / (1 - p[0])))
    assert not bool(valid[0, 0])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        Calibration(num_buckets=0)
    with pytest.raises(ValueError):
        Calibration().observe(torch.rand(3), torch.zeros(4))
    with pytest.raises(ValueError):
        OutcomeModel().allocate([_evidence([0.5])], -1)
    assert OutcomeModel().allocate([], 4).shape == (0, 1)
    for combo in itertools.product([0, 5], [True, False]):
        assert select_outcomes(torch.zeros(2, 3, 2), *combo).sum() == 0


def test_isotonic_matches_pool_adjacent_violators() -> None:
    from sglang_ssd.saguaro.outcome_model import isotonic

    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        y = torch.rand(7, generator=gen, dtype=torch.float64)
        w = torch.rand(7, generator=gen, dtype=torch.float64) + 0.1
        blocks = [[float(y[i] * w[i]), float(w[i]), 1] for i in range(7)]  # PAV reference
        i = 0
        while i < len(blocks) - 1:
            if blocks[i][0] / blocks[i][1] > blocks[i + 1][0] / blocks[i + 1][1]:
                a, b = blocks[i], blocks.pop(i + 1)
                blocks[i] = [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
                i = max(i - 1, 0)
            else:
                i += 1
        expected = [s / v for s, v, c in blocks for _ in range(c)]
        assert isotonic(y, w).tolist() == pytest.approx(expected)


def test_deferred_outcomes_are_learnt_at_the_next_allocation() -> None:
    model, e = OutcomeModel(), _evidence([0.9, 0.9])
    model.defer(e, 0, int(e.candidates[0, 1]))
    assert model.rounds_observed == 0
    model.allocate([e], 4)
    assert model.rounds_observed == 1 and not model.pending
    with pytest.raises(ValueError):
        model.defer(e, 3, 0)
