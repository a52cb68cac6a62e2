"""eval.outcomes on the tiny trained pair: recorded rounds keep the draft's evidence, and on the
same recorded rounds the predicted allocation holds more of the outcomes than geometric's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from eval import outcomes
from eval.sampling import Sampling
from eval.trace.record import record
from eval.trace.target import HFTarget
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.testing.pair_stats import TYPICAL_PROMPTS
from sglang_ssd.testing.tiny_models import tokenize

BUDGET = 8
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def traces(tiny_target: Path, tiny_draft: Path) -> dict[str, dict]:
    """Greedy and T = 0.7 traces of the typical prompts, recorded with evidence."""
    target = HFTarget(tiny_target, dtype=torch.float32)
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=8192)
    config = SSDConfig(lookahead=4, fanout="predicted", fanout_budget=BUDGET)
    prompts = [tokenize(t) for t in TYPICAL_PROMPTS]
    out = {}
    for temperature in (0.0, 0.7):
        engine = SpeculatorEngine(model, config, seed=0)
        sampling = Sampling.of(temperature)
        body = record(target, engine, prompts, sampling, NEW_TOKENS, capture=outcomes.capture)
        out[sampling.name] = {"kind": "ssd-outcomes", "vocab_size": engine.vocab_size, **body}
    return out


def test_greedy_output_is_the_targets_own(traces: dict[str, dict], tiny_target: Path) -> None:
    """With the predicted allocation serving the drafts, greedy SSD equals the target's AR."""
    hf = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    for p in traces["greedy"]["prompts"]:
        ids = torch.tensor([p["input_ids"]])
        n = len(p["output_tokens"])
        ar = hf.generate(  # an explicit mask: token 0 would be taken for padding
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
            pad_token_id=0,
        )  # fmt: skip
        assert p["output_tokens"] == ar[0, ids.shape[1] :].tolist()
    sources = {r["source"] for r in traces["greedy"]["rounds"]}
    assert "cache" in sources and len(sources) > 1  # hits and misses both served


def test_rounds_keep_the_draft_evidence(traces: dict[str, dict]) -> None:
    for trace in traces.values():
        rounds = trace["rounds"]
        assert rounds and all(r["evidence"] is not None for r in rounds)
        for r in rounds:
            e = outcomes.evidence_of(r["evidence"])
            assert e.depth == len(r["draft"]) and e.candidates.shape[1] == BUDGET + 1
            assert bool(((e.probs >= 0) & (e.probs <= 1)).all())
            assert (e.q_cands is None) == (trace["sampling"]["temperature"] == 0.0)
        k = [r["accept_len"] for r in rounds]
        assert 0 < sum(k) < 4 * len(k)  # the pair's acceptance is partial
        json.dumps(trace)  # a trace is JSON


def test_predicted_beats_geometric_on_the_same_rounds(traces: dict[str, dict]) -> None:
    results = {
        name: outcomes.replay_trace(trace, [4, BUDGET], ["geometric", "predicted"])
        for name, trace in traces.items()
    }
    print()
    print(outcomes.format_table([r for rs in results.values() for r in rs]))
    for name, rs in results.items():
        rate = {(r["fanout"], r["budget"]): r["hit_rate"] for r in rs}
        for budget in (4, BUDGET):
            assert rate["predicted", budget] > rate["geometric", budget], (name, rate)
        for shape in ("geometric", "predicted"):
            assert rate[shape, 4] <= rate[shape, BUDGET]  # more rows hold more outcomes
    greedy = {(r["fanout"], r["budget"]): r for r in results["greedy"]}
    assert greedy["predicted", BUDGET]["rounds"] == len(traces["greedy"]["rounds"])


def test_replay_refuses_a_budget_beyond_the_recorded_candidates(traces: dict[str, dict]) -> None:
    with pytest.raises(ValueError, match="candidates"):
        outcomes.replay_trace(traces["greedy"], [2 * BUDGET], ["predicted"])


def test_replay_command_writes_json_and_figure(traces: dict[str, dict], tmp_path: Path) -> None:
    from eval.__main__ import main

    path = tmp_path / "outcomes-trace-t0.7.json"
    path.write_text(json.dumps(traces["t0.7"]))
    out, figure = tmp_path / "replay.json", tmp_path / "fig.png"
    argv = ["outcomes", "replay", str(path), "--budgets", "2", "8", "--fanouts", "uniform"]
    assert main([*argv, "--out", str(out), "--figure", str(figure)]) == 0
    report = json.loads(out.read_text())
    assert report["kind"] == "ssd-outcomes-replay" and len(report["results"]) == 2
    assert all(r["trace"] == "t0.7" and r["fanout"] == "uniform" for r in report["results"])
    assert figure.stat().st_size > 1000
