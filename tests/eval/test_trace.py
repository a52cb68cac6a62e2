"""eval.trace (record / from-run / replay) on tiny random models.

The invariants: a greedy recorded output is the target's own greedy continuation (SSD is
lossless); a replay forces the recorded output exactly and, with the recording's settings and
batch shape, reproduces every recorded round; hit rates lie in [0, 1].
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM

from eval import cli_options
from eval.datasets import Prompt, Record
from eval.sampling import Sampling
from eval.trace import __main__ as trace_cli
from eval.trace.from_run import RunTraceError, trace_from_run
from eval.trace.record import record
from eval.trace.replay import ReplayConfig, format_replay_table, replay, scripted_outcome
from eval.trace.target import HFTarget
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.draft_vocab import DraftVocab
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.int8_model import Int8DraftModel

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]
NEW_TOKENS = 12


def _record(tiny_target, tiny_draft, sampling: Sampling) -> tuple[dict, DraftModel]:
    target = HFTarget(tiny_target, dtype=torch.float32)
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    config = SSDConfig(lookahead=4, fanout_budget=8, fanout="geometric")  # as replayed below
    engine = SpeculatorEngine(model, config, seed=0)
    return record(target, engine, [PROMPT], sampling, NEW_TOKENS, seed=0), model


def test_scripted_outcome_forces_the_recorded_continuation():
    assert scripted_outcome([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert scripted_outcome([5, 6, 7], [5, 6, 7, 1]) == (3, 1)
    assert scripted_outcome([5, 6, 7], [5, 6]) == (1, 6)  # a bonus must remain
    assert scripted_outcome([], [3]) == (0, 3)


def test_record_and_replay_greedy(tiny_target, tiny_draft):
    trace, model = _record(tiny_target, tiny_draft, Sampling.of(0.0))
    (prompt,) = trace["prompts"]
    output, rounds = prompt["output_tokens"], trace["rounds"]
    assert NEW_TOKENS <= len(output) <= NEW_TOKENS + 4
    assert sum(r["accept_len"] + 1 for r in rounds) == len(output)
    assert [r["round"] for r in rounds] == list(range(len(rounds)))
    assert rounds[0]["source"] == "jit" and rounds[0]["committed_len"] == len(PROMPT)
    for prev, nxt in itertools.pairwise(rounds):
        assert nxt["committed_len"] == prev["committed_len"] + prev["accept_len"] + 1
        assert nxt["source"] == ("cache" if prev["hit"] else "jit")
    for r in rounds:
        assert 0 <= r["accept_len"] <= len(r["draft"]) <= 4
        assert min(r["build_s"], r["verify_s"], r["serve_s"]) >= 0
    assert 0.0 <= trace["summary"]["hit_rate"] <= 1.0

    hf = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    ids = torch.tensor([PROMPT])
    # An explicit mask: PROMPT holds token 0, which generate() would otherwise take for padding
    # (pad_token_id=0) and mask out.
    ar = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=len(output),
        do_sample=False,
        pad_token_id=0,
    )
    assert output == ar[0, len(PROMPT) :].tolist(), "greedy SSD must equal the target's AR"

    configs = [
        ReplayConfig(shape, budget, depth)
        for shape in ("uniform", "geometric")
        for budget, depth in ((2, 4), (8, 4), (8, 2))
    ]
    results = replay(model, trace, configs, batch=1)
    assert len(results) == len(configs)
    for r in results:
        assert 0.0 <= r["hit_rate"] <= 1.0 and r["rounds"] > 0
        assert 1.0 <= r["mean_accept_length"] <= 4 + 1  # JIT drafts on misses have γ tokens
        assert r["outputs_reproduced"]
        assert sum(r["fanout_at_start"]) == r["budget"]
    as_recorded = next(
        r for r in results if (r["fanout"], r["budget"], r["depth"]) == ("geometric", 8, 4)
    )
    assert as_recorded["rounds_matching_record"] == 1.0
    assert as_recorded["hit_rate"] == trace["summary"]["hit_rate"]
    assert "hit uni" in format_replay_table(results)


def test_record_and_replay_sampled(tiny_target, tiny_draft):
    trace, model = _record(tiny_target, tiny_draft, Sampling.of(0.7))
    (prompt,) = trace["prompts"]
    assert sum(r["accept_len"] + 1 for r in trace["rounds"]) == len(prompt["output_tokens"])
    results = replay(model, trace, [ReplayConfig("uniform", 4, 4), ReplayConfig("geometric", 4, 4)])
    for r in results:
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert r["outputs_reproduced"]


def _run_results(prompts: list[Prompt], outputs: list[list[int]], temperature: float = 0.0) -> dict:
    """An `eval run` results file's fields that `trace_from_run` reads."""
    return {
        "schema": "sglang-ssd-eval/1",
        "experiment": {"name": "tiny", "dataset": "humaneval"},
        "git": {"commit": "0" * 40},
        "settings": {"sampling": {"temperature": temperature, "top_k": -1, "top_p": 1.0}},
        "prompts": [p.describe() for p in prompts],
        "batches": [
            {
                "config": "AR-2c",
                "repeat": 0,
                "requests": [
                    {"prompt_id": p.id, "output_ids": out, "error": None}
                    for p, out in zip(prompts, outputs, strict=True)
                ],
            }
        ],
    }


def test_trace_from_run_replays_on_each_runtime(tiny_target, tiny_draft, tmp_path, monkeypatch):
    """A served run's greedy outputs become a trace that the bf16 and the int8 runtimes
    replay exactly (the replay forces the recorded text whatever the draft proposes), the
    int8 one with a draft vocabulary of 40 ids (cached beforehand: no count runs)."""
    recorded, recorder = _record(tiny_target, tiny_draft, Sampling.of(0.0))
    monkeypatch.setenv("SGLANG_SSD_CACHE", str(tmp_path))
    kept = DraftVocab(torch.arange(40), recorder.vocab_size, "test")
    draft_vocab.save(kept, tiny_draft, 40)
    output = recorded["prompts"][0]["output_tokens"]
    prompts = [Prompt(Record("humaneval", "HumanEval/0", "x"), tuple(PROMPT))]
    trace = trace_from_run(_run_results(prompts, [output]), prompts, lookahead=4)
    assert trace["prompts"] == [
        {"index": 0, "id": "HumanEval/0", "input_ids": PROMPT, "output_tokens": output}
    ]
    assert trace["rounds"] == [] and trace["sampling"]["top_k"] == 1
    for runtime, vocab in (("torch", 0), ("torch-int8", 40)):
        model = cli_options.load_draft(tiny_draft, runtime, 4096, vocab)
        assert isinstance(model, Int8DraftModel) == (runtime == "torch-int8")
        installed = model.vocab
        assert installed is None if not vocab else torch.equal(installed.ids, kept.ids)
        (result,) = replay(model, trace, [ReplayConfig("geometric", 8, 4)], batch=1)
        assert result["outputs_reproduced"], runtime
        assert 0.0 <= result["hit_rate"] <= 1.0 and 1.0 <= result["mean_accept_length"] <= 5


def test_trace_from_run_refuses_what_it_cannot_replay():
    prompts = [Prompt(Record("humaneval", "HumanEval/0", "x"), tuple(PROMPT))]
    with pytest.raises(RunTraceError, match=r"temperature 0\.7"):
        trace_from_run(_run_results(prompts, [[1, 2]], temperature=0.7), prompts)
    other = [Prompt(Record("humaneval", "HumanEval/0", "x"), (*PROMPT, 1))]
    with pytest.raises(RunTraceError, match="token ids differ"):
        trace_from_run(_run_results(prompts, [[1, 2]]), other)
    with pytest.raises(RunTraceError, match="no units of 'SSD'"):
        trace_from_run(_run_results(prompts, [[1, 2]]), prompts, config="SSD")


def test_from_run_says_what_is_wrong_without_a_traceback(tmp_path, capsys):
    """The command line refuses a file that is not an `eval run` results file, and a replay
    without --out (its old default overwrote a results file kept in the repository)."""
    other = tmp_path / "kernels.json"
    other.write_text('{"kernels": {}}')
    with pytest.raises(SystemExit) as exited:
        trace_cli.main(["from-run", str(other), "--out", str(tmp_path / "t.json")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "is not an `eval run` results file" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        trace_cli.main(["replay", "--traces", str(other)])
    assert "--out" in capsys.readouterr().err
