"""The startup check that the draft shares the target's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from eval.servers import free_port
from sglang_ssd.integration.registration import validate_ssd_server_args
from sglang_ssd.integration.tokenizer_check import (
    TokenizerMismatch,
    check_shared_tokenizer,
    same_tokenizer_files,
    tokenizer_mismatch,
)
from sglang_ssd.testing.processes import run_module
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model, tokenize


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model folder (only its tokenizer matters here)."""
    return make_tiny_model(tmp_path_factory.mktemp("tok") / "model", TinySpec(num_layers=1))


def _variant(source: Path, dest: Path, edit) -> Path:
    """A copy of `source` whose tokenizer.json is rewritten by `edit(dict)`."""
    shutil.copytree(source, dest)
    path = dest / "tokenizer.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))
    return dest


def _swap_a_b(data: dict) -> None:
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]


def test_the_tiny_pair_shares_its_tokenizer(tiny_pair: tuple[Path, Path]) -> None:
    target, draft = tiny_pair
    assert tokenizer_mismatch(str(target), str(draft)) is None
    check_shared_tokenizer(str(target), str(draft))


def test_the_same_tokenizer_saved_differently_passes(tiny: Path, tmp_path: Path) -> None:
    """Byte-different files (no shortcut) with equal contents and a padded embedding table."""
    padded = make_tiny_model(tmp_path / "padded", TinySpec(num_layers=1, vocab_size=256))
    resaved = _variant(padded, tmp_path / "resaved", lambda data: None)
    assert not same_tokenizer_files(tiny, resaved)
    assert tokenizer_mismatch(str(tiny), str(resaved)) is None


def test_swapped_ids_are_refused_naming_both_models(tiny: Path, tmp_path: Path) -> None:
    swapped = _variant(tiny, tmp_path / "swapped", _swap_a_b)
    a, b = tokenize("ab")
    with pytest.raises(TokenizerMismatch) as caught:
        check_shared_tokenizer(str(tiny), str(swapped))
    message = str(caught.value)
    assert str(tiny) in message and str(swapped) in message
    assert f"2 tokens have other ids in the draft ('a': {a} vs {b}, 'b': {b} vs {a})" in message


def test_other_special_tokens_are_refused(tiny: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-eos"
    shutil.copytree(tiny, other)
    config_path = other / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token"] = "~"  # a vocabulary entry, but not the target's EOS
    config_path.write_text(json.dumps(config))
    with pytest.raises(TokenizerMismatch, match="special tokens differ"):
        check_shared_tokenizer(str(tiny), str(other))


def test_a_draft_without_tokenizer_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerMismatch, match="draft's tokenizer could not be loaded"):
        check_shared_tokenizer(str(tiny), str(tmp_path / "absent"))


def _server_args(target: Path, draft: Path) -> SimpleNamespace:
    return SimpleNamespace(
        model_path=str(target),
        tokenizer_path=None,
        speculative_draft_model_path=str(draft),
        speculative_num_steps=4,
        speculative_eagle_topk=1,
        tp_size=1,
        pp_size=1,
        dp_size=1,
    )


def test_server_args_validation_runs_the_check(tiny: Path, tmp_path: Path) -> None:
    validate_ssd_server_args(_server_args(tiny, tiny))
    swapped = _variant(tiny, tmp_path / "swapped", _swap_a_b)
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        validate_ssd_server_args(_server_args(tiny, swapped))


def test_launcher_refuses_a_mismatched_pair_at_startup(tiny: Path, tmp_path: Path) -> None:
    swapped = _variant(tiny, tmp_path / "swapped", _swap_a_b)
    argv = ["--model-path", str(tiny), "--speculative-draft-model-path", str(swapped),
            "--dtype", "float32", "--max-total-tokens", "4096",
            "--port", str(free_port())]  # fmt: skip
    code, output = run_module("sglang_ssd.launch_server", argv)
    assert code != 0
    last = output.strip().splitlines()[-1]
    assert "TokenizerMismatch" in last and str(tiny) in last and str(swapped) in last, last
