"""Our EAGLE-3 trainer on the tiny pair's target: it learns the target (≥ 20 points of top-1
agreement over an untrained head on held-out text), the training-time-test layout is what
drafting does, and a run resumes where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_ssd.build import eagle3_head, evaluate, train, ttt
from sglang_ssd.build.target_pass import target_pass
from sglang_ssd.eagle3 import load
from sglang_ssd.testing.corpus import tiny_corpus
from sglang_ssd.testing.tiny_models import tokenize

AUX = (-1, 0)  # the tiny target has 2 layers: features = embeddings and layer 1's input


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    return model.requires_grad_(False)


@pytest.fixture(scope="module")
def built(tiny_eagle3_head: tuple[Path, dict]) -> tuple[Path, dict]:
    return tiny_eagle3_head


def test_trained_head_beats_untrained_by_20_points(built) -> None:
    _, manifest = built
    gain = manifest["final"]["top1_agreement"] - manifest["untrained"]["top1_agreement"]
    assert gain >= 0.20, manifest["final"]
    assert manifest["final"]["accept_length"] > 1.2
    assert manifest["steps"] > 20 and manifest["learning_curve"]


def test_manifest_and_folder(built) -> None:
    out, manifest = built
    assert (
        json.loads((out / eagle3_head.MANIFEST).read_text())["weights_sha256"]
        == (manifest["weights_sha256"])
    )
    assert manifest["aux_layer_ids"] == list(AUX)
    assert manifest["data"]["corpus"]["tokens"] > 10_000
    head = load.load_head(out)  # strict: every tensor of the file used, every parameter set
    assert head.config.aux_layer_ids == AUX and head.config.draft_vocab_size == 65  # + EOS


def test_ttt_layout_is_what_drafting_does(target: torch.nn.Module, built) -> None:
    """The training-time-test layout (`ttt.Unroll`, which training and `evaluate.chain_drafts`
    share) gives the logits and tokens of drafting one chain token by token with a KV cache,
    after several prefixes (the trained tiny head, whose attention matters)."""
    head = load.load_head(built[0])
    head.attach_target(target.get_input_embeddings().weight.detach())
    columns = head.target_token_ids()
    ids = torch.tensor([tokenize(tiny_corpus(num_chars=200, seed=5))[:40]])
    features, _ = target_pass(target, ids, AUX)
    with torch.no_grad():
        unroll, tokens, steps = ttt.Unroll(head, features, ids.shape[1] - 1), ids[:, 1:], []
        for _ in range(3):
            out = unroll.step(tokens)
            tokens = columns[out.logits.argmax(-1)]
            steps.append((out.logits[0], tokens[0]))
        assert torch.equal(evaluate.chain_drafts(head, ids, features, 3)[0, :, 0], steps[0][1])
        for row in (0, 7, 30):
            # Context: rows 0..row with real features, causal; then 2 own steps, one at a time.
            out = head(ids[:, 1 : row + 2], features[:, : row + 1], torch.arange(row + 1)[None])
            past, hidden, logits = out.kv, out.hidden[:, -1:], out.logits[0, -1]
            for step in range(3):
                want_logits, want_token = steps[step][0][row], steps[step][1][row]
                torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
                token = columns[logits.argmax()].view(1, 1)
                assert int(token) == int(want_token)
                if step < 2:
                    out = head(token, hidden, torch.tensor([[row + step + 1]]), past=past)
                    past, hidden, logits = past.extend(out.kv), out.hidden, out.logits[0, -1]


def test_ttt_mask_pattern() -> None:
    mask = ttt.ttt_mask(3, 2)[0].int().tolist()
    assert mask == [
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ]


def test_a_run_resumes_where_it_stopped(target: torch.nn.Module, tmp_path: Path) -> None:
    seqs = [torch.tensor(tokenize(tiny_corpus(num_chars=400, seed=i))[:64]) for i in range(6)]
    spec = train.TrainSpec(minutes=5, max_steps=4, lr=1e-3, warmup=1)
    head = train.new_head(target, None, AUX)
    first = train.train(head, target, seqs, spec, tmp_path, progress=False)
    assert (first.step, first.cursor) == (4, 4)
    again = train.new_head(target, None, AUX)  # a new process: fresh weights, same folder
    resumed = train.train(again, target, seqs, train.TrainSpec(**{**vars(spec), "max_steps": 7}),
                          tmp_path, progress=False)  # fmt: skip
    assert (resumed.step, resumed.cursor) == (7, 7) and resumed.seconds > first.seconds
    straight = train.new_head(target, None, AUX)
    train.train(straight, target, seqs, train.TrainSpec(**{**vars(spec), "max_steps": 7}),
                tmp_path / "straight", progress=False)  # fmt: skip
    pairs = zip(again.state_dict().items(), straight.state_dict().values(), strict=True)
    for (name, a), b in pairs:
        assert torch.allclose(a, b, atol=1e-6), name


def test_cached_target_passes_train_the_same_head(target: torch.nn.Module, tmp_path: Path) -> None:
    """Sequences visited again reuse the target's cached pass (`feature_cache_mb`): the same
    head as recomputing it every step."""
    seqs = [torch.tensor(tokenize(tiny_corpus(num_chars=400, seed=i))[:64]) for i in range(3)]
    heads = []
    for mb in (0.0, 256.0):
        spec = train.TrainSpec(minutes=5, max_steps=7, lr=1e-3, warmup=1, feature_cache_mb=mb)
        head = train.new_head(target, None, AUX)
        train.train(head, target, seqs, spec, tmp_path / str(mb), progress=False)
        heads.append(head.state_dict())
    for name, weights in heads[0].items():
        assert torch.equal(weights, heads[1][name]), name


def test_sequences_must_be_longer_than_the_unrolled_steps(target, tmp_path: Path) -> None:
    head = train.new_head(target, None, AUX)
    with pytest.raises(ValueError, match="longer than 3"):
        train.train(head, target, [torch.tensor([1, 2, 3])], train.TrainSpec(), tmp_path)


def test_a_checkpoint_of_another_head_or_data_is_refused(target, tmp_path: Path) -> None:
    seqs = [torch.tensor(tokenize(tiny_corpus(num_chars=400, seed=i))[:64]) for i in range(4)]
    spec = train.TrainSpec(minutes=5, max_steps=2, warmup=1)
    train.train(train.new_head(target, None, AUX), target, seqs, spec, tmp_path, progress=False)
    other = train.new_head(target, torch.arange(0, 96), AUX)  # another vocabulary
    with pytest.raises(ValueError, match="another head or other sequences"):
        train.train(other, target, seqs, spec, tmp_path, progress=False)
    with pytest.raises(ValueError, match="another head or other sequences"):
        train.train(train.new_head(target, None, AUX), target, seqs[:3], spec, tmp_path)


@pytest.mark.parametrize(
    ("aux", "match"),
    [((0,), "feature"), ((1, 5), "outside"), ((), "at least one")],
)
def test_new_head_refuses_heads_that_cannot_work(target, aux, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train.new_head(target, None, aux)


def test_saving_again_leaves_one_weights_file(target, tmp_path: Path) -> None:
    head = train.new_head(target, None, AUX)
    load.save_head(tmp_path, head)
    (tmp_path / "model.safetensors").rename(tmp_path / "old-00001.safetensors")
    load.save_head(tmp_path, head)
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["model.safetensors"]
    load.load_head(tmp_path)
