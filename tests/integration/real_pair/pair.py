"""The real Qwen2.5-Coder pair and HumanEval prompts as token ids (test helper, `integration`)."""

from __future__ import annotations

from pathlib import Path

from eval.datasets import HUMANEVAL, load_prompts, load_tokenizer
from eval.servers import Server
from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path


def real_pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return model_path(TARGET_MODEL, pull=True), model_path(DRAFT_MODEL, pull=True)


def humaneval_ids(target: Path, n: int) -> list[list[int]]:
    """The first `n` HumanEval prompts, tokenized by `target`'s tokenizer."""
    tokenizer = load_tokenizer(target)
    return [list(p.input_ids) for p in load_prompts(HUMANEVAL, tokenizer, n=n)]


def shared_servers(target: Path, draft: Path, logs: Path) -> dict[str, Server]:
    """The package's two servers, not started: {"ar": ..., "ssd": ...}.

    - "ar": the target alone (`--speculative-algorithm NONE`), greedy reference for every test.
      Without the overlap scheduler: under it SGLang 0.5.23's penalizers count the prompt's last
      token and lag the output by one (README, Exactness), so only the non-overlap server is
      plain decoding for `test_options`; greedy output without penalties is the same in both.
    - "ssd": SSD with the launcher's defaults, the speculator in its own process on its own
      cores, except a `--ssd-speculator-timeout` of 300 s: on an AVX2-only 2-core CPU the
      speculator's prefill of a batch of 10-16 new requests (one core, ~2k tokens) outlasted
      the default 30 s, and the target counted a fault and restarted a speculator that was
      working, not hung (the tests here check that no fault or restart happens).
    """
    ar = ["--model-path", str(target), "--speculative-algorithm", "NONE"]
    ar.append("--disable-overlap-schedule")
    ssd = [
        *("--model-path", str(target), "--speculative-draft-model-path", str(draft)),
        *("--speculative-algorithm", "SSD", "--ssd-speculator-timeout", "300"),
    ]
    return {
        "ar": Server("ar", ar, log_path=logs / "ar.log"),
        "ssd": Server("ssd", ssd, log_path=logs / "ssd.log"),
    }
