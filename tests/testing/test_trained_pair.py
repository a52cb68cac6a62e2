"""The tiny pair's checks can fail: a random pair is flagged, the trained pair passes them."""

from __future__ import annotations

from pathlib import Path

from sglang_ssd.testing import TinySpec, make_tiny_model
from sglang_ssd.testing.corpus import LINE_BREAK, tiny_corpus
from sglang_ssd.testing.pair_stats import PairStats, pair_problems, pair_stats
from sglang_ssd.testing.tiny_models import tokenize


def test_corpus_is_deterministic_and_in_the_tiny_vocabulary() -> None:
    text = tiny_corpus(5000, seed=3)
    assert text == tiny_corpus(5000, seed=3) != tiny_corpus(5000, seed=4)
    assert "\n" not in text and LINE_BREAK in text
    assert len(tokenize(text)) == len(text)


def test_random_pair_is_flagged_as_degenerate(tmp_path: Path) -> None:
    target = make_tiny_model(tmp_path / "t", TinySpec(seed=0))
    draft = make_tiny_model(tmp_path / "d", TinySpec(num_layers=1, seed=1))
    stats = pair_stats(target, draft, tokens=24)
    problems = pair_problems(stats)
    assert any("distinct ids" in p for p in problems), problems


def test_trained_pair_really_speculates(tiny_pair_stats: PairStats) -> None:
    stats = tiny_pair_stats
    assert pair_problems(stats) == []
    assert 1.5 <= stats.accept_length <= 4 and 0.2 <= stats.hit_rate <= 0.95
    # Outputs differ between prompts: a pair stuck on one sequence would not catch wrong roots.
    assert len({tuple(o) for o in stats.outputs}) == len(stats.outputs)
