"""The EAGLE-3 comparison's configurations (`eval.eagle3_bench`, `python -m eval eagle3`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval import eagle3_bench
from sglang_ssd.launch_server import flag_value


def test_every_speculator_on_both_cores_with_the_same_gamma() -> None:
    cfgs = eagle3_bench.bench_configs("T", "D", "H", lookahead=3)
    by = {c.name: c for c in cfgs}
    assert list(by) == ["AR-2c", "STANDALONE-2c", "EAGLE3-2c", "SSD-1+1c", "SSD-HEAD-1+1c"]
    assert {c.cpus for c in cfgs} == {(0, 1)}
    assert {c.lookahead for c in cfgs if c.algorithm != "NONE"} == {3}
    assert by["EAGLE3-2c"].algorithm == "EAGLE3" and by["SSD-HEAD-1+1c"].algorithm == "SSD"
    for name, draft in (("STANDALONE-2c", "D"), ("EAGLE3-2c", "H"), ("SSD-1+1c", "D")):
        assert flag_value(by[name].args, "--speculative-draft-model-path") == draft, name
    head = by["SSD-HEAD-1+1c"].args
    assert flag_value(head, "--speculative-draft-model-path") == "H"
    assert "--disable-radix-cache" in head and flag_value(head, "--ssd-draft-cpus") == "1"
    assert "--disable-radix-cache" not in by["SSD-1+1c"].args
    assert "greedy" in by["EAGLE3-2c"].notes and "greedy" in by["STANDALONE-2c"].notes
    pairs = {(c, b) for c, b, _, _ in eagle3_bench.COMPARISONS}
    assert ("SSD-HEAD-1+1c", "EAGLE3-2c") in pairs and ("SSD-1+1c", "STANDALONE-2c") in pairs
    assert all(c in by and b in by for c, b in pairs)
    with pytest.raises(ValueError):
        eagle3_bench.bench_configs("T", "D", "H", target_cpu=1, draft_cpu=1)


def test_the_default_head_is_the_built_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_SSD_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="build eagle3"):
        eagle3_bench.default_head("/models/qwen-target")
    head = tmp_path / "models" / "eagle3-qwen-target"
    head.mkdir(parents=True)
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert eagle3_bench.default_head("/models/qwen-target") == head
