"""MT-Bench second turns: the turn-1 answers file (`eval.mtbench_answers`) and the conversations
`eval.datasets.load_prompts(..., answers=)` builds from it, on the tiny target."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval import datasets, mtbench_answers
from eval.cli_options import BadInput
from eval.commands.run_args import mtbench_answers_of
from eval.datasets import MTBENCH, DatasetError, load_prompts, load_records
from eval.trace.from_run import RunTraceError, run_answers

TOKENS = 6


def _greedy(model_dir: Path, text: str) -> str:
    """The model's greedy answer to one user turn, by an argmax loop (not `generate`)."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    start = ids.shape[1]
    with torch.inference_mode():
        for _ in range(TOKENS):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            if int(nxt) == tokenizer.eos_token_id:
                break
    return tokenizer.decode(ids[0, start:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def answers_file(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("answers") / "answers.json"
    mtbench_answers.write_answers(path, tiny_target, ["81", "82"], TOKENS, progress=False)
    return path


def test_answers_are_the_models_greedy_turn_one(tiny_target: Path, answers_file: Path) -> None:
    held = mtbench_answers.load_answers(answers_file)
    assert held.model == tiny_target.name and held.max_new_tokens == TOKENS
    first_turns = {r.id: r.text for r in load_records(MTBENCH)}
    assert set(held.answers) == {"81", "82"}
    for qid, answer in held.answers.items():
        assert answer == _greedy(tiny_target, first_turns[qid])


def test_second_turn_prompt_is_the_conversation(tiny_target: Path, answers_file: Path) -> None:
    """[turn 1, its answer, turn 2] under the chat template, in the order asked."""
    held = mtbench_answers.load_answers(answers_file)
    tokenizer = datasets.load_tokenizer(tiny_target)
    prompts = load_prompts(MTBENCH, tokenizer, ids=["82", "81"], answers=held.answers)
    rows = {str(r["question_id"]): r for r in datasets.eval_prompts.read_jsonl(
        datasets.source_file(MTBENCH))}  # fmt: skip
    assert [p.id for p in prompts] == ["82", "81"]
    for prompt in prompts:
        turns = rows[prompt.id]["turns"]
        assert prompt.record.turn == 2 and prompt.describe()["turn"] == 2
        # The tiny tokenizer's template: "role: content\n" per message, then "assistant: ".
        text = (
            f"user: {turns[0]}\nassistant: {held.answers[prompt.id]}\nuser: {turns[1]}\nassistant: "
        )
        assert list(prompt.input_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
    first = load_prompts(MTBENCH, tokenizer, ids=["81"])[0]
    assert first.record.turn == 1 and "turn" not in first.describe()
    assert first.fingerprint() != prompts[1].fingerprint()


def test_both_sets_alternate_with_second_turns(tiny_target: Path, answers_file: Path) -> None:
    held = mtbench_answers.load_answers(answers_file)
    tokenizer = datasets.load_tokenizer(tiny_target)
    prompts = load_prompts(datasets.BOTH, tokenizer, n=4, answers=held.answers)
    assert [(p.record.dataset, p.record.turn) for p in prompts] == [
        ("humaneval", 1), (MTBENCH, 2), ("humaneval", 1), (MTBENCH, 2),
    ]  # fmt: skip
    assert [p.id for p in prompts[1::2]] == ["81", "82"]


def test_a_question_without_an_answer_names_the_command(
    tiny_target: Path, answers_file: Path
) -> None:
    """A question that exists but is not answered is told apart from an id that is no question."""
    held = mtbench_answers.load_answers(answers_file)
    tokenizer = datasets.load_tokenizer(tiny_target)
    unanswered = r"question\(s\) 83 have no turn-1 answer \(the answers file has 81, 82\)"
    for dataset in (MTBENCH, datasets.BOTH):
        with pytest.raises(DatasetError, match=rf"{unanswered}.*--prompt-ids 83` adds them"):
            load_prompts(dataset, tokenizer, ids=["81", "83"], answers=held.answers)
    with pytest.raises(DatasetError, match=r"^unknown prompt id\(s\): 999$"):
        load_prompts(MTBENCH, tokenizer, ids=["81", "999"], answers=held.answers)


def test_extending_keeps_old_answers_and_refuses_other_settings(
    tiny_target: Path, answers_file: Path, tmp_path: Path
) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(answers_file.read_bytes())
    before = json.loads(path.read_text())["answers"]
    extended = mtbench_answers.write_answers(path, tiny_target, ["83", "81"], TOKENS, False)
    assert set(extended.answers) == {"81", "82", "83"}
    assert {k: extended.answers[k] for k in before} == before
    held = json.loads(path.read_text()) | {"generator": "transformers 4.0.0, greedy"}
    path.write_text(json.dumps(held))  # answers of an older transformers stay as they are
    untouched = path.read_bytes()
    mtbench_answers.write_answers(path, tiny_target, ["82"], TOKENS, False)  # nothing to add
    assert path.read_bytes() == untouched
    with pytest.raises(DatasetError, match=r"--max-new-tokens 6; asked for .* with 7"):
        mtbench_answers.write_answers(path, tiny_target, ["84"], TOKENS + 1, False)


def test_bad_files_are_refused_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"python -m eval\.mtbench_answers"):
        mtbench_answers.load_answers(tmp_path / "none.json")
    other = tmp_path / "other.json"
    other.write_text('{"schema": "sglang-ssd-eval/1"}')
    with pytest.raises(DatasetError, match="not an answers file"):
        mtbench_answers.load_answers(other)
    other.write_text("{")
    with pytest.raises(DatasetError, match="is not JSON"):
        mtbench_answers.load_answers(other)
    with pytest.raises(DatasetError, match="is a directory: name an answers file"):
        mtbench_answers.load_answers(tmp_path)


def test_eval_cli_loads_answers_only_for_second_turns(answers_file: Path, tmp_path: Path) -> None:
    def ns(**kw: object) -> argparse.Namespace:
        base = {"dataset": "both", "mtbench_turn": 2, "mtbench_answers": answers_file}
        return argparse.Namespace(**(base | kw))

    assert mtbench_answers_of(ns(mtbench_turn=1, mtbench_answers=None), tmp_path) is None
    with pytest.raises(BadInput, match="read only with --mtbench-turn 2"):
        mtbench_answers_of(ns(mtbench_turn=1), tmp_path)
    assert set(mtbench_answers_of(ns(), tmp_path).answers) == {"81", "82"}
    with pytest.raises(BadInput, match="needs MT-Bench prompts"):
        mtbench_answers_of(ns(dataset="humaneval"), tmp_path)
    with pytest.raises(BadInput, match="no MT-Bench turn-1 answers at"):
        mtbench_answers_of(ns(mtbench_answers=tmp_path / "x.json"), tmp_path)


def test_from_run_rebuilds_second_turns_only_from_the_same_file(
    answers_file: Path, tmp_path: Path
) -> None:
    held = mtbench_answers.load_answers(answers_file)
    results = {"experiment": {"dataset": "mtbench", "mtbench_answers": held.describe()}}
    assert run_answers(results) == held.answers
    assert run_answers({"experiment": {"dataset": "mtbench"}}) is None
    copy = tmp_path / "copy.json"
    copy.write_text(answers_file.read_text().replace('"answers"', '"answers" ', 1))
    results["experiment"]["mtbench_answers"] = {**held.describe(), "path": str(copy)}
    with pytest.raises(RunTraceError, match="changed since the run"):
        run_answers(results)
