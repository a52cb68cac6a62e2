"""`eval.gpu_model`'s pipeline on the CPU (`--dry-run`: tiny shapes, eager timings).

The GPU run itself is `scripts/gpu_check.sh`; here: the JSON it writes has every timing kind,
one prediction per (speculator timing, rate set), the label of a model, SD computed from the
same timings, and each measurement is on disk as soon as it is added.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from eval import gpu_model
from sglang_ssd.saguaro import expected_accept_length

GRID = ["--batches", "1", "2", "--budgets", "4", "--depths", "2", "--context", "8"]


def test_dry_run_writes_the_model_table(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--dry-run", *GRID, "--reps", "1", "--reps-verify", "1"]
    assert gpu_model.main(argv) == 0
    data = json.loads((tmp_path / "gpu-model-dry-run.json").read_text())
    assert data["status"] == "complete" and data["dry_run"] is True
    assert data["label"].startswith("MODEL with measured GPU timings")
    timings = data["timings"]
    assert sorted((t["batch"], t["tokens"]) for t in timings["verify"]) == [
        (1, 1), (1, 3), (2, 1), (2, 3)
    ]  # fmt: skip
    assert [(t["batch"], t["depth"]) for t in timings["jit"]] == [(1, 2), (2, 2)]
    specs = timings["speculator"]
    assert [(t["batch"], t["budget"], t["depth"]) for t in specs] == [(1, 4, 2), (2, 4, 2)]
    assert all(sum(t["fanout"]) <= 4 for t in specs)
    names = [r["name"] for r in data["rates"]]
    assert names[:4] == ["alpha=0.6", "alpha=0.7", "alpha=0.8", "alpha=0.9"]
    preds = data["predictions"]
    assert len(preds) == len(specs) * len(names)
    verify = {(t["batch"], t["tokens"]): t["seconds"] for t in timings["verify"]}
    jit = {(t["batch"], t["depth"]): t["seconds"] for t in timings["jit"]}
    for row in preds:
        assert 0.0 <= row["p_hit"] <= 1.0
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("ssd_speedup", "sd_speedup"))
        alpha = next(r["alpha"] for r in data["rates"] if r["name"] == row["rates"])
        b, d = row["batch"], row["depth"]
        sd = expected_accept_length(alpha, d) * verify[(b, 1)] / (jit[(b, d)] + verify[(b, d + 1)])
        assert row["sd_speedup"] == pytest.approx(sd)


def test_each_measurement_is_written_at_once(tmp_path: Path) -> None:
    res = gpu_model.Results(tmp_path / "gpu-model-x.json", {"label": gpu_model.LABEL})
    res.add("verify", {"batch": 1, "tokens": 3, "seconds": 0.01})
    data = json.loads((tmp_path / "gpu-model-x.json").read_text())
    assert data["status"] == "running"
    assert data["timings"]["verify"] == [{"batch": 1, "tokens": 3, "seconds": 0.01}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_model.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
