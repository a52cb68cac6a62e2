"""`eval.results_io`: a packed run (its batches gzipped beside it) reads as the run it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval import result_rows, results_io
from eval.__main__ import main

RUN = {
    "schema": "sglang-ssd-eval/1",
    "status": "complete",
    "settings": {"batch_size": 1},
    "prompts": [{"id": "p0"}],
    "configs": [{"name": "AR-2c", "algorithm": "NONE", "args": []}],
    "batches": [
        {
            "config": "AR-2c",
            "repeat": 0,
            "unit": 0,
            "wall_s": 2.0,
            "tokens": 8,
            "tok_per_s": 4.0,
            "requests": [
                {
                    "prompt_id": "p0",
                    "completion_tokens": 8,
                    "output_ids": [1, 2, 3],
                    "tok_per_s": 4.0,
                    "latency_s": 2.0,
                    "finish_reason": {"type": "length"},
                    "meta_info": {},
                }
            ],
        },
    ],
}


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "ssd-bench-x.json"
    path.write_text(json.dumps(RUN, indent=1) + "\n")
    return path


def test_a_packed_run_reads_back_whole_with_its_keys_in_order(run_file: Path) -> None:
    side = results_io.pack(run_file)
    assert side == run_file.with_name("ssd-bench-x.batches.json.gz") and side.is_file()
    packed = json.loads(run_file.read_text())
    assert "batches" not in packed and packed["batches_file"] == side.name
    assert list(packed) == [k if k != "batches" else "batches_file" for k in RUN]
    again = results_io.read_results(run_file)
    assert again == RUN and list(again) == list(RUN)
    assert result_rows.load(run_file) == RUN  # the figures' and the report's reader


def test_packing_is_reproducible_and_leaves_other_documents_alone(
    run_file: Path, tmp_path: Path
) -> None:
    first = results_io.pack(run_file)
    assert first is not None
    raw = first.read_bytes()
    run_file.write_text(json.dumps(RUN))
    assert results_io.pack(run_file) is not None and first.read_bytes() == raw
    assert raw[4:8] == bytes(4) and not raw[3] & 0x08  # gzip's header: no time, no file name
    other = tmp_path / "model-check.json"
    other.write_text(json.dumps({"checks": []}))
    assert results_io.pack(other) is None and json.loads(other.read_text()) == {"checks": []}


def test_missing_batches_and_bad_json_are_named(run_file: Path) -> None:
    side = results_io.pack(run_file)
    assert side is not None
    side.unlink()
    with pytest.raises(FileNotFoundError):
        results_io.read_results(run_file)
    run_file.write_text("{")
    with pytest.raises(ValueError, match=f"{run_file}: not JSON"):
        results_io.read_results(run_file)


def test_eval_show_reads_a_packed_run(run_file: Path, capsys: pytest.CaptureFixture) -> None:
    results_io.pack(run_file)
    assert main(["show", str(run_file)]) == 0
    assert "AR-2c" in capsys.readouterr().out
