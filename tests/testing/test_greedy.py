"""check_greedy: every token checked, teacher-forced after each allowed divergence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sglang_ssd.testing.greedy import (
    MEASURED_MARGIN_EPS,
    Divergence,
    GreedyCheck,
    MarginsFn,
    check_greedy,
    first_divergence,
    margin_eps_source,
    measured_margin_eps,
    walk_divergences,
)

PROMPT = [100, 101]


class FakeAR:
    """A greedy 'model' whose next token is a fixed function of the context: the reference."""

    def __init__(self, rule: dict[tuple[int, ...], int] | None = None) -> None:
        self.rule = rule or {}
        self.calls: list[tuple[list[int], int]] = []

    def next(self, context: Sequence[int]) -> int:
        return self.rule.get(tuple(context[-2:]), (context[-1] * 7 + 3) % 50)

    def generate(self, context: Sequence[int], n: int) -> list[int]:
        out, ctx = [], list(context)
        for _ in range(n):
            out.append(self.next(ctx))
            ctx.append(out[-1])
        return out

    def continue_ar(self, context: Sequence[int], n: int) -> list[int]:
        self.calls.append((list(context), n))
        return self.generate(context, n)


def _margins(value: float, log: list[list[int]] | None = None):
    def margins(model_dir: str | Path, contexts: Sequence[Sequence[int]]) -> list[float]:
        if log is not None:
            log.extend(list(c) for c in contexts)
        return [value] * len(contexts)

    return margins


def _check(
    ar: FakeAR | None, expected: list[int], got: list[int], margins: MarginsFn
) -> GreedyCheck:
    """One prompt checked at ε 0.2, continued by `ar` (None: the first divergence ends it)."""
    return check_greedy(
        "m",
        [PROMPT],
        [expected],
        [got],
        eps=0.2,
        margins=margins,
        continue_ar=ar.continue_ar if ar else None,
    )


def _follow_after(ar: FakeAR, context: list[int], forced: int, n: int) -> list[int]:
    """`forced` at the next position, then `ar`'s greedy choices: an output that diverged once
    (as SSD does where bf16 flips the argmax) and is right from its own prefix on."""
    return [forced, *ar.generate([*context, forced], n - 1)]


def test_identical_outputs_are_checked_in_full_without_margins() -> None:
    ar = FakeAR()
    out = ar.generate(PROMPT, 20)
    check = _check(ar, out, out, _margins(9.0))
    assert check.passed and check.prompts[0].identical
    assert (check.checked, check.total) == (20, 20)
    assert ar.calls == []


def test_after_an_allowed_divergence_the_rest_is_checked_from_ssds_own_prefix() -> None:
    ar = FakeAR()
    expected = ar.generate(PROMPT, 30)
    flipped = (expected[10] + 1) % 50
    got = expected[:10] + _follow_after(ar, PROMPT + expected[:10], flipped, 20)
    contexts: list[list[int]] = []
    check = _check(ar, expected, got, _margins(0.05, contexts))
    assert check.passed
    assert check.prompts[0].divergences == (Divergence(10, expected[10], flipped, 0.05),)
    assert (check.checked, check.total) == (30, 30)
    assert ar.calls == [([*PROMPT, *got[:11]], 19)]
    assert contexts == [[*PROMPT, *got[:10]]]


def test_a_wrong_token_after_an_allowed_divergence_is_found() -> None:
    """The old check stopped at the first divergence: this bug at token 20 went unseen."""
    ar = FakeAR()
    expected = ar.generate(PROMPT, 30)
    got = expected[:5] + _follow_after(ar, PROMPT + expected[:5], (expected[5] + 1) % 50, 25)
    wrong = (got[20] + 2) % 50
    got = got[:20] + _follow_after(ar, PROMPT + got[:20], wrong, 10)
    margin_at = {5 + len(PROMPT): 0.05, 20 + len(PROMPT): 3.0}
    seen: list[list[int]] = []

    def margins(model_dir: str | Path, contexts: Sequence[Sequence[int]]) -> list[float]:
        seen.extend(list(c) for c in contexts)
        return [margin_at[len(c)] for c in contexts]

    check = _check(ar, expected, got, margins)
    assert [d.index for d in check.prompts[0].divergences] == [5, 20]
    assert check.prompts[0].divergences[1].got == wrong
    assert len(check.violations) == 1 and "token 20" in check.violations[0]
    assert check.checked == 30
    # Each margin is taken on SSD's own context (the reference's differs after token 5).
    assert seen == [[*PROMPT, *got[:5]], [*PROMPT, *got[:20]]]
    # Without a continuation only the first divergence is seen, and the check passes.
    old = _check(None, expected, got, margins)
    assert old.passed and old.checked == 6 and len(old.prompts[0].divergences) == 1


def test_every_divergence_is_reported_with_its_margin_and_judged_against_eps() -> None:
    ar = FakeAR()
    expected = ar.generate(PROMPT, 12)
    got = expected[:3] + _follow_after(ar, PROMPT + expected[:3], (expected[3] + 1) % 50, 9)
    got = got[:8] + _follow_after(ar, PROMPT + got[:8], (got[8] + 1) % 50, 4)
    check = _check(ar, expected, got, _margins(0.2))
    assert [(d.index, d.margin) for d in check.prompts[0].divergences] == [(3, 0.2), (8, 0.2)]
    assert len(check.violations) == 2  # margin == eps is not below eps


def test_a_divergence_at_the_last_token_needs_no_continuation() -> None:
    ar = FakeAR()
    expected = ar.generate(PROMPT, 8)
    got = [*expected[:7], (expected[7] + 1) % 50]
    check = _check(ar, expected, got, _margins(0.01))
    assert check.passed and check.checked == 8 and ar.calls == []


def test_length_differences_are_divergences() -> None:
    ar = FakeAR()
    expected = ar.generate(PROMPT, 10)
    # The output under test stopped early (its EOS is not in output_ids): all of it is checked.
    short = _check(ar, expected, expected[:6], _margins(0.01))
    assert short.prompts[0].divergences == (Divergence(6, expected[6], -1, 0.01),)
    assert (short.checked, short.total) == (6, 6)
    # The reference stopped early: the rest continues from the tested output's prefix.
    longer = expected + ar.generate(PROMPT + expected, 4)
    long = _check(ar, expected, longer, _margins(0.01))
    assert [d.index for d in long.prompts[0].divergences] == [10]
    assert long.checked == 14 and ar.calls[-1] == ([*PROMPT, *longer[:11]], 3)


def test_continue_ar_returning_too_many_tokens_is_an_error() -> None:
    with pytest.raises(ValueError, match="asked for 2"):
        walk_divergences(PROMPT, [1, 2, 3, 4], [1, 9, 3, 4], lambda ctx, n: [0] * (n + 1))


def test_margins_are_computed_once_for_all_prompts() -> None:
    ar = FakeAR()
    calls: list[int] = []

    def margins(model_dir: str | Path, contexts: Sequence[Sequence[int]]) -> list[float]:
        calls.append(len(contexts))
        return [0.01] * len(contexts)

    outs = [ar.generate([p], 6) for p in (1, 2, 3)]
    got = [
        [*o[:2], *_follow_after(ar, [p, *o[:2]], (o[2] + 1) % 50, 4)]
        for p, o in zip((1, 2, 3), outs, strict=True)
    ]
    check = check_greedy(
        "m", [[1], [2], [3]], outs, got, continue_ar=ar.continue_ar, margins=margins
    )
    assert calls == [3]
    assert [len(p.divergences) for p in check.prompts] == [1, 1, 1]


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == Divergence(1, 2, 5)
    assert first_divergence([1, 2], [1, 2, 7]) == Divergence(2, -1, 7)
    assert first_divergence([1, 2, 7], [1, 2]) == Divergence(2, 7, -1)


def test_eps_comes_from_the_measurement_file(tmp_path: Path) -> None:
    path = tmp_path / "margin-eps.json"
    assert measured_margin_eps(path) == MEASURED_MARGIN_EPS  # absent
    path.write_text(json.dumps({"summary": {"eps": 0.321}}))
    assert measured_margin_eps(path) == 0.321
    path.write_text(json.dumps({"chains": []}))  # a run still measuring: no summary yet
    assert measured_margin_eps(path) == MEASURED_MARGIN_EPS


def test_eps_source_names_the_file_or_the_constant(tmp_path: Path) -> None:
    path = tmp_path / "margin-eps.json"
    assert margin_eps_source(path).endswith("MEASURED_MARGIN_EPS")
    path.write_text(json.dumps({"summary": {"eps": 0.3}}))
    assert margin_eps_source(path) == str(path)


def test_bf16_weights_give_the_margins_of_the_same_weights_in_fp32(tmp_path: Path) -> None:
    # The real target is stored in bf16; its margins must be those of a float32 forward.
    import torch
    from transformers import AutoModelForCausalLM

    from sglang_ssd.testing.greedy import _fp32_top2_margins, run_in_fp32
    from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

    folder = make_tiny_model(tmp_path / "bf16", TinySpec(dtype=torch.bfloat16, num_layers=2))
    prefixes = [[5, 9, 17, 3], [40, 41, 42, 43, 44, 45, 7], [11]]
    lean = _fp32_top2_margins(folder, prefixes)

    full = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    bf16 = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    with torch.inference_mode():
        ref, low = [], []
        for prefix in prefixes:
            for model, out in ((full, ref), (bf16, low)):
                top = torch.topk(model(torch.tensor([prefix])).logits[0, -1].float(), 2).values
                out.append(float(top[0] - top[1]))
    assert lean == pytest.approx(ref, abs=1e-5)
    assert low != pytest.approx(ref, abs=1e-5)  # bf16 compute differs: the check has power
    # The weights are back in bf16 and the hooks come off.
    handles = run_in_fp32(bf16)
    assert handles and all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    for handle in handles:
        handle.remove()
    assert not bf16._forward_pre_hooks and run_in_fp32(full) == []
