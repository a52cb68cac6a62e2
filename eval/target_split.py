"""`python -m eval target-split`: where the target's forward goes, inside SGLang's model code.

The target is loaded in this process by SGLang's own one-batch benchmark kit
(`sglang.benchmark.one_batch.load_model`: a `ModelRunner` with the server's CPU attention
backend, `intel_amx` on sglang-ssd's `sgl_kernel` shim), with `--quantization` as given. One
request's prefix is prefilled, then each point is timed `--repeats` times:
- 1 row: a DECODE forward (one token per round of plain decoding);
- k rows (γ + 1 = 5, 4 × (γ + 1) = 20): an EXTEND forward of k new tokens after the cached
  prefix. Its projections, norms, RoPE and attention (`extend_attention_cpu`, which SGLang's
  backend also runs for TARGET_VERIFY) are a verify's; its LM head computes the last row only,
  so the head over all k rows (what a verify computes) is timed on its own (`lm_head_rows`).

Per forward, in milliseconds (medians): `forward` (the model's `forward`), `matmuls` (SGLang's
linear layers: qkv, o, gate_up, down), `attention` (the attention layers, KV write included),
`shim` (the part of it inside the shim's `decode/extend_attention_cpu`), `norms`, `rope`,
`act` (SiLU x up), `embedding`, `lm_head` (the logits processor) and `rest` (forward minus
those: residual adds, glue, Python). A profiled pass splits the forward into time inside torch
ops and between them (`python`), as shares applied to the unprofiled forward.

Floors (`floors`): the weight bytes one forward streams (linear layers and LM head, in their
stored precision) over this core's read bandwidth (`kernels.read_bandwidth_gb_s`), and its
multiply-adds over the best rate a large GEMM of that precision reaches here; the floor is
the larger. Loading is timed too (`load_s`, the process's peak RSS after it, and for
`ssd_int8` whether its cache beside the checkpoint was there).

Usage: python -m eval target-split [--target PATH] [--quantization ssd_int8] [--rows 1 5 20]
    [--cpus 0] [--repeats 7] [--prefix 200] [--out eval/results/target-split-<precision>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from eval import cli_options
from eval.bench_speculator.forward_split import op_self_times
from eval.bench_speculator.kernels import read_bandwidth_gb_s

PARTS = ("matmuls", "attention", "shim", "norms", "rope", "act", "embedding", "lm_head")
ROWS = (1, 5, 20)
RESULTS = Path("eval/results")


def _part_of(module: torch.nn.Module) -> str | None:
    """The timed part SGLang's `module` belongs to, or None."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    kinds: list[tuple[type | tuple[type, ...], str]] = [
        (LinearBase, "matmuls"), (RadixAttention, "attention"), (RMSNorm, "norms"),
        (SiluAndMul, "act"), (LogitsProcessor, "lm_head"),
    ]  # fmt: skip
    for kind, part in kinds:
        if isinstance(module, kind):
            return part
    if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
        return "embedding"
    return "rope" if type(module).__name__.endswith("RotaryEmbedding") else None


class Split:
    """Times the parts of the model's forwards while `recording`: module hooks, the attention
    backend's two shim ops wrapped on the backend instance, and the model's `forward`.

    Attributes:
        forwards: one dict of seconds per part (plus "forward") per recorded forward.
    """

    def __init__(self, runner: Any) -> None:
        self.forwards: list[dict[str, float]] = []
        self.recording = False
        self._current: dict[str, float] = {}
        self._starts: dict[int, float] = {}
        self._handles = []
        self._model = runner.model
        for module in self._model.modules():
            part = _part_of(module)
            if part is not None:
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._post(part)))
        self._backend = runner.attn_backend
        for name in ("decode_attention_fwd", "extend_attention_fwd"):
            setattr(self._backend, name, self._timed(getattr(self._backend, name), "shim"))
        self._model.forward = self._timed(self._model.forward, "forward")

    def close(self) -> None:
        """Remove every hook and wrapper."""
        for handle in self._handles:
            handle.remove()
        for name in ("decode_attention_fwd", "extend_attention_fwd", "forward"):
            owner = self._model if name == "forward" else self._backend
            setattr(owner, name, getattr(owner, name).__wrapped__)
        vars(self._model).pop("forward", None)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        self._starts[id(module)] = time.perf_counter()

    def _post(self, part: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            start = self._starts.pop(id(module), None)
            if self.recording and start is not None:
                self._current[part] = self._current.get(part, 0.0) + time.perf_counter() - start

        return hook

    def _timed(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                if part != "forward":
                    return fn(*args, **kwargs)
                with torch.profiler.record_function("target_forward"):
                    return fn(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                if self.recording:
                    self._current[part] = self._current.get(part, 0.0) + seconds
                    if part == "forward":
                        self.forwards.append(self._current)
                        self._current = {}

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed


def _load(target: Path, quantization: str | None, max_tokens: int) -> Any:
    """SGLang's `ModelRunner` of `target` on the CPU, by SGLang's one-batch benchmark kit (the
    server's own start-up path for one rank), with sglang-ssd's plugin loaded."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import sglang_ssd.plugin as plugin

    plugin.load()
    from sglang.benchmark import one_batch
    from sglang.srt.layers.rotary_embedding import base as rope
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    if not rope._is_cpu:
        raise RuntimeError("SGLang was imported before SGLANG_USE_CPU_ENGINE=1 was set")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ["--model-path", str(target), "--device", "cpu", "--attention-backend", "intel_amx"]
    argv += ["--max-total-tokens", str(max_tokens), "--disable-radix-cache"]
    argv += ["--quantization", quantization] if quantization else []
    server_args = ServerArgs.from_cli_args(parser.parse_args(argv))
    server_args.resolve_once()
    one_batch._set_envs_and_config(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    one_batch._init_process_global_configs()
    runner, _ = one_batch.load_model(server_args, PortArgs.init_new(server_args), 0, 0)
    return runner


class Request:
    """One request on `runner` (SGLang's one-batch kit): its prefill, then EXTEND forwards of
    k new tokens and DECODE forwards, each growing the cached prefix."""

    def __init__(self, runner: Any, prefix: Sequence[int]) -> None:
        from sglang.benchmark import one_batch

        self.runner = runner
        (self.req,) = one_batch.prepare_synthetic_inputs_for_latency_test(1, len(prefix), [prefix])
        self.next_ids, _, self.batch = runner.extend([self.req])
        self._filler = list(prefix)

    def extend(self, k: int) -> None:
        """One EXTEND forward of `k` new tokens (taken from the prefix, cyclically)."""
        ids = self.req.full_untruncated_fill_ids
        start = len(ids)
        ids.extend(self._filler[(start + i) % len(self._filler)] for i in range(k))
        self.req.prefix_len, self.req.extend_end = start, start + k
        self.req.logprob_start_len = -1
        self.next_ids, _, self.batch = self.runner.extend([self.req])

    def decode(self) -> None:
        """One DECODE forward (the token the last forward sampled)."""
        self.next_ids, _ = self.runner.decode(self.next_ids, self.batch)


def measure(request: Request, split: Split, rows: int, repeats: int) -> dict[str, Any]:
    """`repeats` recorded forwards at `rows` rows (after one warm-up), and one profiled one.

    Returns:
        {"rows", "forwards": [seconds per part], "ops_share", "python_share"}.
    """
    step = request.decode if rows == 1 else lambda: request.extend(rows)
    step()
    split.forwards.clear()
    split.recording = True
    try:
        for _ in range(repeats):
            step()
    finally:
        split.recording = False
    forwards = list(split.forwards)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    total = inside = 0.0
    for event in prof.events():
        if event.name == "target_forward":
            total += event.cpu_time_total
            inside += sum(op_self_times(event))
    share = inside / total if total else float("nan")
    return {"rows": rows, "forwards": forwards, "ops_share": share, "python_share": 1 - share}


def lm_head_ms(runner: Any, rows: int, repeats: int) -> float:
    """Median ms of the LM head (SGLang's logits processor's matmul) over `rows` rows, as a
    verify computes it for every one of its rows."""
    model = runner.model
    hidden = torch.randn(rows, model.config.hidden_size, dtype=torch.bfloat16)
    compute = model.logits_processor._compute_lm_head
    compute(hidden, model.lm_head)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compute(hidden, model.lm_head)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def gemm_gmacs_per_s(int8: bool, size: int = 2048, rows: int = 256) -> float:
    """The best multiply-add rate (1e9/s) a [rows, size] x [size, size] GEMM reaches here, in
    bf16 (`torch.mm`) or int8 (the `ssd_int8` kernel, `int8_kernel.int8_linear`), best of 5."""
    from sglang_ssd.target.int8_kernel import int8_linear, pack_rows, quantize_rows

    a, b = torch.randn(rows, size).bfloat16(), torch.randn(size, size).bfloat16()
    if int8:
        packed = pack_rows(*quantize_rows(b.T))
        mm: Callable[[], Any] = lambda: int8_linear(a, packed)  # noqa: E731
    else:
        mm = lambda: torch.mm(a, b)  # noqa: E731
    mm()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        mm()
        best = min(best, time.perf_counter() - start)
    return rows * size * size / best / 1e9


def floors(runner: Any, rows: int, head_rows: int, gb_s: float, gmacs: float) -> dict[str, float]:
    """The weight-streaming and compute floors of one forward at `rows` rows whose LM head
    computes `head_rows` rows.

    Returns:
        {"weight_mb", "gmacs", "stream_ms", "compute_ms", "floor_ms"}.
    """
    from sglang.srt.layers.linear import LinearBase

    model = runner.model
    layers = [m for m in model.modules() if isinstance(m, LinearBase)]
    nbytes = sum(m.weight.nbytes for m in layers) + model.lm_head.weight.nbytes
    macs = rows * sum(m.weight.numel() for m in layers)
    macs += head_rows * model.lm_head.weight.numel()
    stream, compute = nbytes / 1e9 / gb_s * 1e3, macs / 1e9 / gmacs * 1e3
    return {"weight_mb": nbytes / 1e6, "gmacs": macs / 1e9, "stream_ms": stream,
            "compute_ms": compute, "floor_ms": max(stream, compute)}  # fmt: skip


def summarize(run: dict[str, Any], head_k_ms: float, floor: dict[str, float]) -> dict[str, Any]:
    """Median ms per part of one `measure` run, its verify-equivalent forward (the LM head
    over every row) and its floors."""
    forwards = run["forwards"]
    ms = {p: 1e3 * statistics.median(f.get(p, 0.0) for f in forwards) for p in ("forward", *PARTS)}
    rest = [f["forward"] - sum(f.get(p, 0.0) for p in PARTS if p != "shim") for f in forwards]
    ms["rest"] = 1e3 * statistics.median(rest)
    rows = run["rows"]
    verify = ms["forward"] - ms["lm_head"] + head_k_ms if rows > 1 else ms["forward"]
    return {
        "rows": rows, "ms": ms, "lm_head_rows_ms": head_k_ms, "verify_forward_ms": verify,
        "python_ms": ms["forward"] * run["python_share"], "floors": floor,
        "over_floor": verify / floor["floor_ms"],
    }  # fmt: skip


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The split as a text table, one line per row count."""
    head = ["rows", "forward", *PARTS, "rest", "python", "head@k", "verify", "floor", "x floor"]
    lines = [" ".join(f"{h:>9}" for h in head)]
    for r in rows:
        cells = [str(r["rows"]), *(f"{r['ms'][p]:.1f}" for p in ("forward", *PARTS, "rest"))]
        cells += [f"{r['python_ms']:.1f}", f"{r['lm_head_rows_ms']:.1f}"]
        cells += [f"{r['verify_forward_ms']:.1f}", f"{r['floors']['floor_ms']:.1f}"]
        cells += [f"{r['over_floor']:.2f}"]
        lines.append(" ".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


@contextmanager
def _pinned(cpus: Sequence[int]) -> Iterator[None]:
    from sglang_ssd.launch.placement import pin_process

    pin_process(list(cpus))
    yield


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's options."""
    p.add_argument("--target", type=Path, help="target model folder (default: the 1.5B)")
    p.add_argument("--quantization", help="SGLang's --quantization, e.g. ssd_int8 (default bf16)")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="rows per forward")
    p.add_argument("--repeats", type=int, default=7, help="timed forwards per row count")
    p.add_argument("--prefix", type=int, default=200, help="prefix tokens")
    cli_options.add_cpus(p, (0,), "CPUs to pin to; torch threads = their count (default 0)")
    p.add_argument("--out", type=Path, help="results JSON (default eval/results/target-split-…)")


def run(a: argparse.Namespace) -> int:
    """Measure, print the table, write the JSON."""
    from eval import datasets
    from eval.configs import default_model_dirs
    from eval.provenance import model_info, run_header
    from sglang_ssd.target.int8_cache import FOLDER

    target = a.target or default_model_dirs()[0]
    prompt = datasets.load_prompts(datasets.HUMANEVAL, datasets.load_tokenizer(target), 4)
    prefix = [t for p in prompt for t in p.input_ids][: a.prefix]
    cache_before = (target / FOLDER).is_dir() and any((target / FOLDER).iterdir())
    with _pinned(a.cpus):
        torch.set_num_threads(len(a.cpus))
        start = time.perf_counter()
        runner = _load(target, a.quantization, 4 * a.prefix + 64 * max(a.rows) * a.repeats)
        load_s = time.perf_counter() - start
        torch.set_num_threads(len(a.cpus))  # SGLang's CPU set-up may have changed it
        peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        torch_runner = runner.torch_runner
        gb_s = read_bandwidth_gb_s()
        gmacs = gemm_gmacs_per_s(int8=a.quantization == "ssd_int8")
        request = Request(runner, prefix)
        split = Split(torch_runner)
        try:
            runs = [measure(request, split, rows, a.repeats) for rows in a.rows]
        finally:
            split.close()
        heads = {rows: lm_head_ms(torch_runner, rows, a.repeats) for rows in a.rows}
    summary = [
        summarize(r, heads[r["rows"]], floors(torch_runner, r["rows"], r["rows"], gb_s, gmacs))
        for r in runs
    ]
    precision = a.quantization or "bf16"
    out = a.out or RESULTS / f"target-split-{precision}-{len(a.cpus)}c.json"
    report = {
        "kind": "target-forward-split",
        **run_header("eval target-split", sys.argv[1:]),
        "models": {"target": model_info(Path(target))},
        "settings": {"quantization": a.quantization, "rows": a.rows, "repeats": a.repeats,
                     "prefix": a.prefix, "cpus": list(a.cpus),
                     "torch_threads": torch.get_num_threads()},
        "load": {"load_s": load_s, "peak_rss_gb": peak_rss_gb, "int8_cache_present": cache_before},
        "read_gb_per_s": gb_s, "gemm_gmacs_per_s": gmacs,
        "summary": summary, "raw": runs,
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(summary))
    print(f"load {load_s:.1f} s, peak RSS {peak_rss_gb:.2f} GB; wrote {out}")
    return 0
