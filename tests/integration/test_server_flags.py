"""SGLang server flags under SSD: the declaration (`server_flags.FLAGS`), the docs/flags.md
table it renders, and real `python -m sglang_ssd.launch_server` starts that refuse each refused row.

The "works" rows are served by the tests each row names (`FlagRule.evidence`); this module
checks that those files exist and mention the flag.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_ssd.integration.registration import validate_ssd_server_args
from sglang_ssd.integration.server_flags import FLAGS, flags_table, refuse_unsupported_flags
from sglang_ssd.testing.processes import run_module

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(tp_size=1, pp_size=1, dp_size=1, device="cpu")

# Refused row -> (server args that trigger it, the same as launcher flags).
REFUSED: dict[str, tuple[dict[str, Any], list[str]]] = {
    "`--enable-lora`, `--lora-paths`": (
        {"enable_lora": True},
        ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all"],
    ),
    "`--quantization` other than `ssd_int8`, GGUF targets (on CPU)": (
        {"quantization": "fp8"},
        ["--quantization", "fp8"],
    ),
    "`--enable-hierarchical-cache`": (
        {"enable_hierarchical_cache": True},
        ["--enable-hierarchical-cache"],
    ),
    "`--enable-torch-compile` (on CPU)": (
        {"enable_torch_compile": True},
        ["--enable-torch-compile"],
    ),
    "multimodal targets": ({}, []),  # needs a multimodal config: checked below
    # These two need a head folder: checked below.
    "an EAGLE-3 head draft without `--disable-radix-cache`": ({}, []),
    "`--enable-return-hidden-states` with an EAGLE-3 head draft": ({}, []),
    "`--tokenizer-worker-num` > 1": ({"tokenizer_worker_num": 2}, ["--tokenizer-worker-num", "2"]),
    "`--enable-custom-logit-processor`": (
        {"enable_custom_logit_processor": True},
        ["--enable-custom-logit-processor"],
    ),
    "`--enable-watermark`": ({"enable_watermark": True}, ["--enable-watermark"]),
    "`--enable-strict-thinking`": ({"enable_strict_thinking": True}, ["--enable-strict-thinking"]),
    # SGLang refuses this one itself on CPU (intel_amx attention) before SSD's check runs.
    "`--enable-deterministic-inference`": ({"enable_deterministic_inference": True}, []),
    "`--attn-dp-size` > 1, `--enable-dp-attention`": (
        {"attn_dp_size": 2},
        ["--dp-size", "2", "--tp-size", "2", "--enable-dp-attention"],
    ),
    "`--pp-size`, `--nnodes` > 1": ({"pp_size": 2}, ["--pp-size", "2"]),
}


def _args(**extra: Any) -> SimpleNamespace:
    return SimpleNamespace(**{**BASE, **extra})


def test_every_refused_row_has_a_trigger_and_only_it_refuses() -> None:
    refused = [rule for rule in FLAGS if not rule.works]
    assert {rule.flags for rule in refused} == set(REFUSED)
    refuse_unsupported_flags(_args())  # nothing set: nothing refused
    for rule in refused:
        fields, _ = REFUSED[rule.flags]
        if not fields:
            continue
        with pytest.raises(ValueError, match="not supported with --speculative-algorithm SSD"):
            refuse_unsupported_flags(_args(**fields))
        others = [r for r in refused if r is not rule]
        assert not any(r.refused(_args(**fields)) for r in others), rule.flags
    assert all(rule.refused is None for rule in FLAGS if rule.works)


def test_cpu_only_rows_pass_on_cuda_and_gguf_targets_are_refused_on_cpu() -> None:
    refuse_unsupported_flags(_args(device="cuda", quantization="fp8", enable_torch_compile=True))
    refuse_unsupported_flags(_args(quantization="ssd_int8"))  # ours passes on CPU
    for gguf in ({"model_path": "/m/target.gguf"}, {"load_format": "gguf"}):
        with pytest.raises(ValueError, match="--quantization other than ssd_int8, GGUF targets"):
            refuse_unsupported_flags(_args(**gguf))


def test_multimodal_targets_are_refused(tiny_target: Path, tmp_path: Path) -> None:
    refuse_unsupported_flags(_args(model_path=str(tiny_target)))
    config = json.loads((tiny_target / "config.json").read_text())
    config["architectures"] = ["Qwen2VLForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="multimodal targets: not supported"):
        refuse_unsupported_flags(_args(model_path=str(tmp_path)))


def test_an_eagle3_head_draft_needs_the_radix_cache_off(tiny_draft: Path, tmp_path: Path) -> None:
    """A head serves with `--disable-radix-cache` only, and without hidden-state returns; a
    causal LM draft (or a hub name) is not affected."""
    refuse_unsupported_flags(_args(speculative_draft_model_path=str(tiny_draft)))
    refuse_unsupported_flags(_args(speculative_draft_model_path="Qwen/not-a-folder"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    head = dict(speculative_draft_model_path=str(tmp_path))
    with pytest.raises(ValueError, match=r"EAGLE-3 head draft without --disable-radix-cache"):
        refuse_unsupported_flags(_args(**head))
    refuse_unsupported_flags(_args(**head, disable_radix_cache=True))
    with pytest.raises(ValueError, match=r"--enable-return-hidden-states with an EAGLE-3 head"):
        refuse_unsupported_flags(
            _args(**head, disable_radix_cache=True, enable_return_hidden_states=True)
        )
    refuse_unsupported_flags(
        _args(speculative_draft_model_path=str(tiny_draft), enable_return_hidden_states=True)
    )


def test_works_rows_name_a_test_that_uses_the_flag() -> None:
    for rule in FLAGS:
        evidence = ROOT / rule.evidence
        assert evidence.is_file(), f"{rule.flags}: {rule.evidence} is missing"
        if rule.works:
            first = rule.flags.split("`")[1] if "`" in rule.flags else rule.flags
            name = first.split(" ")[0].lstrip("-").replace("-", "_")
            text = evidence.read_text()
            assert first.split(" ")[0] in text or name in text, (rule.flags, rule.evidence)


def test_docs_table_is_the_declaration() -> None:
    flags_doc = (ROOT / "docs" / "flags.md").read_text()
    assert flags_table() in flags_doc, "docs/flags.md's server-flag table differs from FLAGS"


def test_validate_ssd_server_args_applies_the_flag_rules(tiny_target: Path) -> None:
    model = str(tiny_target)
    args = dict(
        model_path=model,
        speculative_draft_model_path=model,
        speculative_num_steps=4,
        speculative_eagle_topk=1,
    )
    validate_ssd_server_args(_args(**args))
    with pytest.raises(ValueError, match="--enable-hierarchical-cache: not supported"):
        validate_ssd_server_args(_args(**args, enable_hierarchical_cache=True))


def _argv(target: Path, draft: Path, flags: list[str]) -> list[str]:
    return [
        *("--model-path", str(target), "--speculative-draft-model-path", str(draft)),
        *("--port", "39999", *flags),
    ]


def _expected(name: str) -> str:
    return f"{name.replace('`', '')}: not supported with --speculative-algorithm SSD"


def test_launcher_refuses_each_refused_flag(tiny_target: Path, tiny_draft: Path) -> None:
    """Every refused flag, through the launcher's path up to serving
    (`sglang_ssd.testing.resolve_args`), raises SSD's reason naming the flag; one real `python
    -m sglang_ssd.launch_server` start (beside it) exits non-zero before serving, with that
    message in its output. Both run from the session's zygote when it has one
    (`testing.processes.run_module`)."""
    cases = {
        name: _argv(tiny_target, tiny_draft, flags) for name, (_, flags) in REFUSED.items() if flags
    }
    real_name, real_argv = next(iter(cases.items()))
    with cf.ThreadPoolExecutor(2) as pool:
        real = pool.submit(run_module, "sglang_ssd.launch_server", real_argv, 240)
        code, output = run_module("sglang_ssd.testing.resolve_args", [json.dumps(cases)], 240)
        real_code, real_output = real.result()
    assert code == 0 and "RESULTS " in output, output[-3000:]
    results = json.loads(output.split("RESULTS ", 1)[1].splitlines()[0])
    assert set(results) == set(cases)
    for name, got in results.items():
        assert got.startswith("ValueError: ") and _expected(name) in got, (name, got)
    assert real_code != 0 and _expected(real_name) in real_output, real_output[-3000:]
    assert "Uvicorn running" not in real_output
