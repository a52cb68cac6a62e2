"""`python -m eval.bench_speculator.forward_split`: where one tree forward of the draft goes.

"The forward" is one tree-decode forward of `engine.build`: fan-out budget B rows
(one request; B = 1 and B = 8 by default), tree depth D = 4, on one pinned core, the draft with
its default reduced vocabulary (`--ssd-draft-vocab`). Each measured build follows a depth-D
cache hit, as in serving. Per tree forward it reports, in milliseconds (medians over builds):
- `forward`: the whole `DraftModel.forward` call (body + LM head);
- `matmuls`: the decoder layers' `nn.Linear` projections (q, k, v, o, gate, up, down);
- `attention`: the registered attention function (KV write into the pool + branch attention);
- `norms`, `rope` (the rotary module's cos/sin), `embedding`;
- `rest`: the body's remainder (residual adds, SiLU x up, applying RoPE, HF's glue, Python);
- `lm_head`: the LM head over the reduced vocabulary, widened to float32;
- per build: `sampling` (the engine's phase over the build) and the build's wall time.
Module hooks time each part (a few microseconds per hook). A second, profiled pass
(`torch.profiler`, CPU) splits the body into time inside torch ops (`ops`) and the time between
them (`python`: interpreter and dispatch); the profiler's own overhead inflates that pass, so its
figures are given as shares of its body time, applied to the unprofiled body.

Floors (`floors`): the weight bytes one forward streams (bf16 layers + the reduced LM head) and
its multiply-adds, from the model's shapes.

`--compile SCOPE` first wraps part of every decoder layer in `torch.compile` (inductor on the
CPU, `dynamic=True`): `mlp-norms` (the MLP with its SiLU x up, and both RMSNorms) or `layer`
(the whole decoder layer; dynamo breaks the graph at the paged attention). The report's
`wall_s` (the whole measurement) then holds the compiling, in its first warm-up build, beside
what a `--compile none` run's `wall_s` holds.

Usage: python -m eval.bench_speculator.forward_split [--rows 1 8] [--depth 4] [--repeats 9]
    [--cpu 1] [--draft PATH] [--draft-runtime auto] [--compile {none,mlp-norms,layer}]
    [--out eval/results/forward-split.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from eval import cli_options
from eval.bench_speculator.timing import make_prefixes
from eval.sampling import Sampling
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import ATTN_IMPLEMENTATION, DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

HOOKED = ("matmuls", "norms", "rope", "embedding")
PARTS = ("matmuls", "attention", "norms", "rope", "embedding", "rest", "lm_head")
DEPTH = 4
ROWS = (1, 8)
# A decoder projection: float (the torch runtime) or int8 (the torch-int8 runtime).
LINEARS = (torch.nn.Linear, DynamicInt8Linear)
RESULTS = Path("eval/results")


def _part_of(name: str, module: torch.nn.Module, lm_head: torch.nn.Module) -> str | None:
    """The hooked part `module` belongs to, or None."""
    kind = type(module).__name__
    if module is lm_head:
        return None  # timed as the forward's lm_head phase
    if isinstance(module, LINEARS):
        return "matmuls"
    if kind.endswith("RMSNorm") or isinstance(module, torch.nn.LayerNorm):
        return "norms"
    if kind.endswith("RotaryEmbedding"):
        return "rope"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    return None


class Split:
    """Times the parts of the draft's tree forwards while `measuring`.

    Attributes:
        forwards: one dict per tree forward: phase, rows, and seconds per part plus "forward"
            and "body".
    """

    def __init__(self, model: DraftModel) -> None:
        self.model = model
        self.forwards: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self._starts: dict[int, float] = {}
        self._handles = []
        for name, module in model.hf.named_modules():
            part = _part_of(name, module, model.lm_head)
            if part is not None:
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._post(part)))
        self._attention = ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION]
        ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION] = self._timed_attention
        self._forward = model.forward
        model.forward = self._timed_forward  # type: ignore[method-assign]

    def close(self) -> None:
        """Remove every hook and wrapper."""
        for handle in self._handles:
            handle.remove()
        ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION] = self._attention
        vars(self.model).pop("forward", None)  # the class's own method again

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._current is not None:
            self._starts[id(module)] = time.perf_counter()

    def _post(self, part: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            start = self._starts.pop(id(module), None)
            if self._current is not None and start is not None:
                self._current[part] += time.perf_counter() - start

        return hook

    def _timed_attention(self, *args: Any, **kwargs: Any) -> Any:
        if self._current is None:
            return self._attention(*args, **kwargs)
        start = time.perf_counter()
        try:
            return self._attention(*args, **kwargs)
        finally:
            self._current["attention"] += time.perf_counter() - start

    def _timed_forward(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        phase = kwargs.get("phase", "forward")
        if not phase.startswith("tree_"):
            return self._forward(input_ids, *args, **kwargs)
        seconds = self.model.phases.seconds
        before = {p: seconds.get(p, 0.0) for p in (phase, "lm_head")}
        self._current = {"phase": phase, "rows": int(input_ids.numel())}
        self._current |= {part: 0.0 for part in (*HOOKED, "attention")}
        start = time.perf_counter()
        try:
            with torch.profiler.record_function("tree_forward"):
                return self._forward(input_ids, *args, **kwargs)
        finally:
            record, self._current = self._current, None
            record["forward"] = time.perf_counter() - start
            record["body"] = seconds.get(phase, 0.0) - before[phase]
            record["lm_head"] = seconds.get("lm_head", 0.0) - before["lm_head"]
            inside = sum(record[p] for p in (*HOOKED, "attention"))
            record["rest"] = record["body"] - inside
            self.forwards.append(record)


def _advance(engine: SpeculatorEngine, rid: str) -> None:
    """Apply the cached outcome with the largest k (a depth-D hit, as `bench_speculator` does
    with the smallest; either keeps the next draft a cache hit)."""
    branches = engine.requests[rid].branches
    state = engine.requests[rid]
    if branches is not None and branches.ks:
        row = max(range(len(branches.ks)), key=lambda i: branches.ks[i])
        engine.apply_outcomes([OutcomeIn(rid, branches.ks[row], branches.bonus[row])])
    else:
        engine.apply_outcomes([OutcomeIn(rid, 0, state.committed[-1])])
    if engine.requests[rid].draft is None:
        engine.serve([rid], "jit", engine.config.lookahead)


def measure(
    model: DraftModel,
    prefix: Sequence[int],
    rows: int,
    depth: int = DEPTH,
    repeats: int = 9,
    profile: bool = True,
) -> dict[str, Any]:
    """The split of `repeats` builds at fan-out budget `rows` and tree depth `depth` (one
    request on `prefix`), plus (if `profile`) one profiled build's ops/python shares.

    Returns:
        {"rows_asked", "depth", "forwards": [per tree forward: phase, rows, seconds per part],
        "builds": [{"seconds", "sampling_s"}], "profiled": {"ops_share", "python_share"} or None}.

    Raises:
        RuntimeError: if a build does not run 1 + depth forwards.
    """
    config = SSDConfig(mode="async", fanout="geometric", beta=1.0, tree_depth=depth,
                       fanout_budget=rows)  # fmt: skip
    engine = SpeculatorEngine(model, config, seed=0)
    rid = f"split-{rows}"
    greedy = Sampling.of(0.0)
    engine.open(rid, list(prefix), greedy.temperature, greedy.top_k, greedy.top_p, seed=0)
    engine.serve([rid], "jit", config.lookahead)
    engine.build([rid])  # warm-up
    _advance(engine, rid)
    split = Split(model)
    builds = []
    try:
        for _ in range(repeats):
            engine.phases.take()
            count = model.forward_count
            start = time.perf_counter()
            engine.build([rid])
            seconds = time.perf_counter() - start
            if model.forward_count - count != 1 + depth:
                raise RuntimeError(f"a build ran {model.forward_count - count} forwards")
            sampling = engine.phases.take().get("sampling", 0.0)
            builds.append({"seconds": seconds, "sampling_s": sampling})
            _advance(engine, rid)
        forwards = list(split.forwards)
        profiled = _profiled_shares(engine, rid) if profile else None
    finally:
        split.close()
        engine.close(rid)
    return {"rows_asked": rows, "depth": depth, "forwards": forwards, "builds": builds,
            "profiled": profiled}  # fmt: skip


def _profiled_shares(engine: SpeculatorEngine, rid: str) -> dict[str, float]:
    """Shares of the tree forwards' time spent inside torch ops and between them, from one
    build under `torch.profiler`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.build([rid])
    _advance(engine, rid)
    total = inside = 0.0
    for event in prof.events():
        if event.name == "tree_forward":
            total += event.cpu_time_total
            inside += sum(op_self_times(event))
    return {"ops_share": inside / total, "python_share": 1.0 - inside / total}


def op_self_times(event: Any) -> Iterator[float]:
    """Self CPU time of every op below `event` (its descendants)."""
    for child in event.cpu_children:
        yield child.self_cpu_time_total
        yield from op_self_times(child)


def _weight(module: torch.nn.Module) -> torch.Tensor:
    """A linear layer's weight, float or int8."""
    return module.weight() if isinstance(module, DynamicInt8Linear) else module.weight


def floors(model: DraftModel, rows: int) -> dict[str, float]:
    """Weight bytes one forward streams and its multiply-adds (projections + LM head rows).

    Returns:
        {"weight_mb": MB of layer and LM-head weights (in the runtime's own precision, which
        its LM head shares), "gmacs": 1e9 multiply-adds of their matmuls at `rows` rows
        (attention's are negligible at these context lengths)}.
    """
    weights = [
        _weight(m) for m in model.hf.modules() if isinstance(m, LINEARS) and m is not model.lm_head
    ]
    head_rows = model.vocab.size if model.vocab is not None else model.vocab_size
    elements = sum(w.numel() for w in weights) + head_rows * model.lm_head.weight.shape[1]
    size = weights[0].element_size()
    return {"weight_mb": elements * size / 1e6, "gmacs": rows * elements / 1e9}


def summarize(run: dict[str, Any], model: DraftModel) -> dict[str, Any]:
    """Median milliseconds per part of one `measure` run's tree forwards (and per build)."""
    forwards = run["forwards"]
    ms = {p: 1e3 * statistics.median(f[p] for f in forwards) for p in ("forward", "body", *PARTS)}
    rows = statistics.median(f["rows"] for f in forwards)
    out: dict[str, Any] = {"rows_asked": run["rows_asked"], "rows_median": rows, "ms": ms}
    out["build_ms"] = 1e3 * statistics.median(b["seconds"] for b in run["builds"])
    out["sampling_ms_per_build"] = 1e3 * statistics.median(b["sampling_s"] for b in run["builds"])
    if run["profiled"]:
        out["body_ops_ms"] = ms["body"] * run["profiled"]["ops_share"]
        out["body_python_ms"] = ms["body"] * run["profiled"]["python_share"]
    out["floors"] = floors(model, round(rows))
    out["matmul_gb_per_s"] = (
        out["floors"]["weight_mb"] / 1e3 / ((ms["matmuls"] + ms["lm_head"]) / 1e3)
        if ms["matmuls"] + ms["lm_head"] > 0
        else None
    )
    return out


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The split as a text table, one line per row count."""
    head = ["rows", "forward", *PARTS, "ops", "python", "sampling/build", "build", "GB/s"]
    lines = [" ".join(f"{h:>9}" for h in head)]
    for r in rows:
        ms = r["ms"]
        cells = [f"{r['rows_median']:g}", *(f"{ms[p]:.1f}" for p in ("forward", *PARTS))]
        cells += [f"{r.get('body_ops_ms', float('nan')):.1f}"]
        cells += [f"{r.get('body_python_ms', float('nan')):.1f}"]
        cells += [f"{r['sampling_ms_per_build']:.1f}", f"{r['build_ms']:.1f}"]
        cells += [f"{r['matmul_gb_per_s'] or float('nan'):.1f}"]
        lines.append(" ".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


COMPILE_SCOPES = ("none", "mlp-norms", "layer")


def compile_layers(model: DraftModel, scope: str) -> None:
    """Wrap `scope` (`COMPILE_SCOPES`) of every decoder layer of `model` in `torch.compile`
    (inductor, `dynamic=True`); compiling happens at the first forward after this.

    Raises:
        ValueError: on an unknown scope.
    """
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"scope must be one of {COMPILE_SCOPES}, got {scope!r}")
    if scope == "none":
        return
    for layer in model.base.layers:
        if scope == "layer":
            layer.forward = torch.compile(layer.forward, dynamic=True)
            continue
        for module in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
            module.forward = torch.compile(module.forward, dynamic=True)


@contextlib.contextmanager
def _pinned(cpu: int) -> Iterator[None]:
    from sglang_ssd.launch.placement import pin_process

    pin_process([cpu])
    torch.set_num_threads(1)
    yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_speculator.forward_split",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    cli_options.add_pair(parser)
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="fan-out B")
    parser.add_argument("--depth", type=int, default=DEPTH, help="tree depth D")
    parser.add_argument("--repeats", type=int, default=9, help="measured builds per B")
    parser.add_argument("--prefix", type=int, default=200, help="prefix tokens")
    parser.add_argument("--cpu", type=int, default=1, help="the core to pin to")
    cli_options.add_draft_vocab(parser)
    cli_options.add_draft_runtime(parser)
    parser.add_argument(
        "--compile", choices=COMPILE_SCOPES, default="none", help="torch.compile this scope"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "forward-split.json")
    a = parser.parse_args(argv)

    from eval import datasets
    from eval.configs import model_dirs
    from eval.provenance import model_info, run_header

    target_dir, draft_dir = model_dirs(a.target, a.draft)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, datasets.load_tokenizer(target_dir), 4)
    (prefix,) = make_prefixes([p.input_ids for p in prompts], 1, a.prefix)
    with _pinned(a.cpu):
        model = cli_options.load_draft(draft_dir, a.draft_runtime, 8192, a.draft_vocab)
        compile_layers(model, a.compile)
        start = time.perf_counter()
        runs = [measure(model, prefix, rows, a.depth, a.repeats) for rows in a.rows]
        wall_s = time.perf_counter() - start  # with compiling, in the first warm-up build
    rows = [summarize(run, model) for run in runs]
    report = {
        "kind": "forward-split",
        **run_header("eval.bench_speculator.forward_split", list(argv or sys.argv[1:])),
        "models": {"draft": model_info(Path(draft_dir))},
        "settings": {"depth": a.depth, "repeats": a.repeats, "prefix": a.prefix, "cpu": a.cpu,
                     "draft_vocab": a.draft_vocab, "draft_runtime": a.draft_runtime,
                     "torch_threads": torch.get_num_threads(), "compile": a.compile},
        "wall_s": wall_s,
        "summary": rows,
        "raw": runs,
    }  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(rows))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
