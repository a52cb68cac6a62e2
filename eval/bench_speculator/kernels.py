"""`python -m eval.bench_speculator.kernels`: the draft's projections under each CPU weight
kernel torch offers, on one core, against the core's streaming floor.

A draft forward's matmuls are its decoder projections (q, k, v, o, gate, up, down per layer) and
its LM head over the draft vocabulary. This times that chain as one `F.linear`-like call per
weight, with the real draft's shapes (read from its `config.json`) and random weights, at 1 and
8 rows, for each kernel of `KERNELS`:
- `bf16`: `F.linear` on bf16 weights and activations (the torch runtime; oneDNN, AMX or
  AVX512-BF16 where the CPU has them);
- `fbgemm-int8`: torch's dynamically quantised linear (int8 weights per output row, activations
  quantised per call; the torch-int8 runtime);
- `int8-per-row`: the target's `--quantization ssd_int8` kernel (`sglang_ssd.target.int8_kernel`:
  FBGEMM's int8 GEMM, int8 weights per row, activations quantised per row);
- `int8-weight-only`: `aten._weight_int8pack_mm` (int8 weights per row, bf16 activations);
- `int4-packed`: `aten._weight_int4pack_mm_for_cpu` (4-bit weights in groups of 128 with a
  bf16 scale and zero each, bf16 activations);
- `onednn-int8`: `onednn.qlinear_pointwise` on prepacked int8 weights (activations quantised
  per call to uint8, float32 output; AMX's int8 tiles where the CPU has them). Tried as a draft
  runtime at 2ffb177 ("torch-int8-onednn") and not kept: SSD with it ran at 1.25x AR-2c against
  FBGEMM's 1.42x on the AMX Xeon (docs/benchmarks.md).

The floor: the weight bytes each kernel streams over the core's read bandwidth (a float32
`sum` over 256 MB, best of 5). Medians of `--repeats` chains, in milliseconds.

Usage: python -m eval.bench_speculator.kernels [--draft PATH] [--draft-vocab 65536]
    [--rows 1 8] [--cpu 1] [--repeats 7] [--layers N] [--kernels NAME ...]
    [--out eval/results/kernels.json]
(`--draft` alone is the draft; without it, the pulled 0.5B. Any Qwen2-style folder works: the
target's shapes are `--draft <1.5B folder> --draft-vocab 0 --layers 4`.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from eval import cli_options
from sglang_ssd.target.int8_kernel import quantize_rows

Chain = Callable[[dict[int, torch.Tensor]], None]
GROUP = 128  # int4 group size


def projection_shapes(config: dict[str, Any], draft_vocab: int) -> list[tuple[int, int]]:
    """(out, in) of every projection of a Qwen2/Llama-style `config`, layer by layer, then the
    LM head's (`draft_vocab` rows, or the full vocabulary when 0)."""
    h, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    kv = int(config.get("num_key_value_heads") or heads) * head_dim
    layer = [(heads * head_dim, h), (kv, h), (kv, h), (h, heads * head_dim)]
    layer += [(inter, h), (inter, h), (h, inter)]
    vocab = draft_vocab or int(config["vocab_size"])
    return layer * int(config["num_hidden_layers"]) + [(vocab, h)]


def _bf16(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    wb = [w.bfloat16() for w in ws]

    def run(xs: dict[int, torch.Tensor]) -> None:
        for w in wb:
            F.linear(xs[w.shape[1]].bfloat16(), w)

    return run, sum(w.nbytes for w in wb)


def _fbgemm_int8(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    from sglang_ssd.speculator.int8_model import int8_linear

    layers = [int8_linear(w, None) for w in ws]

    def run(xs: dict[int, torch.Tensor]) -> None:
        for layer, w in zip(layers, ws, strict=True):
            layer(xs[w.shape[1]])

    return run, sum(w.numel() for w in ws)


def _int8_weight_only(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    packed = [(q, s.bfloat16()) for q, s in map(quantize_rows, ws)]

    def run(xs: dict[int, torch.Tensor]) -> None:
        for q, s in packed:
            torch.ops.aten._weight_int8pack_mm(xs[q.shape[1]].bfloat16(), q, s)

    return run, sum(q.nbytes + s.nbytes for q, s in packed)


def _int4_packed(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    packed = []
    for w in ws:
        n, k = w.shape
        g = w.reshape(n, k // GROUP, GROUP)
        low, high = g.amin(-1), g.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        q = ((g - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
        zero = low + 8 * scale  # the kernel computes (q - 8) * scale + zero
        scales_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().bfloat16()
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), 1)
        packed.append((weight, scales_zeros, k))

    def run(xs: dict[int, torch.Tensor]) -> None:
        for weight, scales_zeros, k in packed:
            torch.ops.aten._weight_int4pack_mm_for_cpu(
                xs[k].bfloat16(), weight, GROUP, scales_zeros
            )

    return run, sum(w.nbytes + sz.nbytes for w, sz, _ in packed)


def _onednn_int8(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    packed = []
    for w in ws:
        q, s = quantize_rows(w)
        prepacked = torch.ops.onednn.qlinear_prepack(q, [8, w.shape[1]])
        packed.append((prepacked, s, torch.zeros(w.shape[0], dtype=torch.int64), w.shape[1]))

    def run(xs: dict[int, torch.Tensor]) -> None:
        for weight, scale, zeros, k in packed:
            x = xs[k]
            x_scale = float(x.abs().amax()) / 127 or 1e-8
            qx = (x / x_scale + 128).round().clamp(0, 255).to(torch.uint8)
            torch.ops.onednn.qlinear_pointwise(
                qx, x_scale, 128, weight, scale, zeros, None, 1.0, 0, torch.float32,
                "none", [], "",
            )  # fmt: skip

    return run, sum(w.numel() for w in ws)  # one byte a weight


def _int8_per_row(ws: list[torch.Tensor]) -> tuple[Chain, int]:
    from sglang_ssd.target.int8_kernel import int8_linear, pack_rows

    packed = [(pack_rows(*quantize_rows(w)), w.shape[1]) for w in ws]

    def run(xs: dict[int, torch.Tensor]) -> None:
        for weight, k in packed:
            int8_linear(xs[k].bfloat16(), weight)

    return run, sum(w.numel() for w in ws)  # one byte a weight


KERNELS: dict[str, Callable[[list[torch.Tensor]], tuple[Chain, int]]] = {
    "bf16": _bf16,
    "fbgemm-int8": _fbgemm_int8,
    "int8-per-row": _int8_per_row,
    "int8-weight-only": _int8_weight_only,
    "int4-packed": _int4_packed,
    "onednn-int8": _onednn_int8,
}


def read_bandwidth_gb_s(mb: int = 256) -> float:
    """The core's read bandwidth: a float32 `sum` over `mb` MB, best of 5, in GB/s."""
    a = torch.ones(mb * 2**20 // 4)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - started)
    return a.nbytes / best / 1e9


def time_chain(run: Chain, widths: set[int], rows: int, repeats: int) -> float:
    """Median milliseconds of `run` over `repeats` calls (after one warm-up) at `rows` rows."""
    xs = {k: torch.randn(rows, k) for k in widths}
    run(xs)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(xs)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def measure(
    shapes: Sequence[tuple[int, int]], rows: Sequence[int], repeats: int, kernels: Sequence[str]
) -> dict[str, Any]:
    """Per kernel: weight MB, ms per chain at each row count and its floor (ms), or the error
    that kernel raised on this machine."""
    torch.manual_seed(0)
    ws = [torch.randn(o, i) * 0.02 for o, i in shapes]
    widths = {i for _, i in shapes}
    bandwidth = read_bandwidth_gb_s()
    out: dict[str, Any] = {"read_gb_per_s": bandwidth, "kernels": {}}
    for name in kernels:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run, nbytes = KERNELS[name](ws)
                ms = {str(r): time_chain(run, widths, r, repeats) for r in rows}
        except (RuntimeError, NotImplementedError, AttributeError) as exc:  # a build without it
            out["kernels"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        floor = nbytes / 1e9 / bandwidth * 1e3
        out["kernels"][name] = {"weight_mb": nbytes / 1e6, "ms": ms, "floor_ms": floor}
        print(f"{name:>18}: {nbytes / 1e6:7.0f} MB, floor {floor:6.1f} ms, "
              + ", ".join(f"rows={r} {v:6.1f} ms" for r, v in ms.items()), flush=True)  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_speculator.kernels",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--draft", type=Path, help="the draft's folder (default: the pulled 0.5B)")
    cli_options.add_draft_vocab(parser)  # the LM head's rows
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="rows per matmul")
    parser.add_argument("--cpu", type=int, default=1, help="the core to pin to")
    parser.add_argument("--repeats", type=int, default=7, help="timed chains per point")
    parser.add_argument(
        "--layers", type=int, default=0,
        help="time the first N decoder layers only, then the LM head (0: all; bounds the "
        "float32 weights this builds, e.g. for the 1.5B target)",
    )  # fmt: skip
    parser.add_argument(
        "--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS),
        help="the kernels to time (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=Path("eval/results/kernels.json"), help="results JSON"
    )
    a = parser.parse_args(argv)

    from eval.configs import default_model_dirs
    from eval.provenance import run_header
    from sglang_ssd.launch.placement import pin_process

    draft_dir = a.draft if a.draft is not None else default_model_dirs()[1]
    if not (draft_dir / "config.json").is_file():
        parser.error(f"--draft {draft_dir}: no config.json there")
    config = json.loads((draft_dir / "config.json").read_text())
    pin_process([a.cpu])
    torch.set_num_threads(1)
    shapes = projection_shapes(config, a.draft_vocab)
    if a.layers:  # the first N layers' projections, then the LM head
        shapes = shapes[: 7 * a.layers] + shapes[-1:]
    report = {
        **run_header("eval.bench_speculator.kernels", list(argv or sys.argv[1:])),
        "draft": str(draft_dir),
        "draft_vocab": a.draft_vocab,
        "projections": len(shapes),
        **measure(shapes, a.rows, a.repeats, a.kernels),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
