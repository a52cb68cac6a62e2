"""Greedy-equality checks with the numerics rule of docs/design.md#the-greedy-rule.

Greedy outputs must match token for token. The only allowed exception is a position where the
target's top-2 logit margin, recomputed in fp32 on the common context, is below ε: there bf16
rounding that depends on batch shape and forward mode (DECODE vs TARGET_VERIFY) may
legitimately flip the argmax. After such a position the two outputs continue from different
contexts, so the check goes on teacher-forced: the reference (AR) continues from the checked
output's own prefix (`continue_ar`) and the rest is compared against that, until every token of
the output has been checked.

ε is measured, not chosen: `python -m eval.margin` writes eval/results/margin-eps.json with
ε = 1.5 × the largest fp32 top-2 margin among teacher-forced positions where SGLang's decode
argmax and its TARGET_VERIFY argmax differ.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Where `python -m eval.margin` writes the measured ε (present in a source checkout only).
MARGIN_EPS_FILE = Path(__file__).resolve().parents[2] / "eval" / "results" / "margin-eps.json"
# Logit units. Used when MARGIN_EPS_FILE is absent (an installed package): the last measurement
# committed there (`summary.eps` 0.31998 = 1.5 × 0.2133, over 3,829 teacher-forced positions of
# the lossless HumanEval prompts, 6 of them with differing decode/verify argmaxes).
MEASURED_MARGIN_EPS = 0.32


def _read_eps(path: Path) -> float | None:
    """`summary.eps` of a `python -m eval.margin` results file; None if absent or unfinished."""
    try:
        eps = json.loads(path.read_text())["summary"]["eps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(eps) if isinstance(eps, int | float) and eps > 0 else None


def measured_margin_eps(path: Path = MARGIN_EPS_FILE) -> float:
    """ε from `python -m eval.margin`'s results file, else `MEASURED_MARGIN_EPS`."""
    eps = _read_eps(path)
    return MEASURED_MARGIN_EPS if eps is None else eps


def margin_eps_source(path: Path = MARGIN_EPS_FILE) -> str:
    """Where `measured_margin_eps` takes ε from: the file's path, or the constant's name."""
    return "sglang_ssd.testing.greedy.MEASURED_MARGIN_EPS" if _read_eps(path) is None else str(path)


DEFAULT_MARGIN_EPS = measured_margin_eps()

# (context token ids, prompt included; n) -> the reference's next ≤ n greedy token ids.
ContinueFn = Callable[[Sequence[int], int], Sequence[int]]
# (model folder, contexts) -> the target's fp32 top-2 margin after each context.
MarginsFn = Callable[[str | Path, Sequence[Sequence[int]]], list[float]]


@dataclass(frozen=True)
class Divergence:
    """A position where two greedy outputs differ, and the target's fp32 margin there.

    `index` counts output tokens; -1 as a token means that output had ended there.
    """

    index: int
    expected: int
    got: int
    margin: float | None = None


@dataclass(frozen=True)
class PromptCheck:
    """One output's check: every divergence found, and how many of its tokens were compared.

    Attributes:
        divergences: in output order, each with its fp32 margin.
        checked: tokens of the checked output compared against the reference's greedy choice
            in the same context (a divergent token counts as checked).
        total: tokens of the checked output.
    """

    divergences: tuple[Divergence, ...]
    checked: int
    total: int

    @property
    def identical(self) -> bool:
        return not self.divergences


@dataclass(frozen=True)
class GreedyCheck:
    """The result of `check_greedy`. Empty `violations` means the check passed."""

    prompts: tuple[PromptCheck, ...]
    violations: tuple[str, ...]
    eps: float

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def checked(self) -> int:
        return sum(p.checked for p in self.prompts)

    @property
    def total(self) -> int:
        return sum(p.total for p in self.prompts)


def first_divergence(expected: Sequence[int], got: Sequence[int]) -> Divergence | None:
    """The first index where the outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return Divergence(i, int(a), int(b))
    if len(expected) != len(got):
        i = min(len(expected), len(got))
        longer = expected if len(expected) > len(got) else got
        return Divergence(
            i, int(longer[i]) if longer is expected else -1, int(longer[i]) if longer is got else -1
        )
    return None


# Weights above this are loaded in a child process (`in_child`), not in the test process.
IN_PROCESS_BYTES = 256 * 2**20


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a spawned child process, its result returned (`fn` and the arguments
    must pickle). A real model loaded there gives its memory back when the child ends, while
    a freed heap stays with this process: the 1.5B target in fp32 (6 GB) in the test process
    beside the real pair's servers ran a 24 GB machine out of memory (`make test-real`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def weight_bytes(model_dir: str | Path) -> int:
    """Bytes of the `*.safetensors` / `*.bin` weight files of a model folder."""
    files = [*Path(model_dir).glob("*.safetensors"), *Path(model_dir).glob("*.bin")]
    return sum(f.stat().st_size for f in files)


def fp32_top2_margins(model_dir: str | Path, prefixes: Sequence[Sequence[int]]) -> list[float]:
    """The target's fp32 top-2 logit margin after each prefix (loads and frees the model; in a
    child process when its weights exceed `IN_PROCESS_BYTES`). Weights stay in the folder's
    dtype and each module computes in fp32 (`run_in_fp32`): for the bf16 1.5B target a peak
    RSS of 5.0 GB, 3.1 GB of it the memory-mapped weights, against 10.9 GB for the model
    loaded in fp32, with equal margins (measured on the 2-core AVX2 EPYC)."""
    if weight_bytes(model_dir) > IN_PROCESS_BYTES:
        return in_child(_fp32_top2_margins, str(model_dir), [list(p) for p in prefixes])
    return _fp32_top2_margins(model_dir, prefixes)


def _fp32_top2_margins(model_dir: str | Path, prefixes: Sequence[Sequence[int]]) -> list[float]:
    from transformers import AutoModelForCausalLM

    # Weights stay in the folder's dtype (bf16 for the real pair: 3.1 GB for the 1.5B target
    # instead of 6.2 GB in fp32) and run in fp32 one module at a time (`run_in_fp32`).
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
    handles = run_in_fp32(model)
    margins = []
    with torch.inference_mode():
        for prefix in prefixes:
            logits = model(torch.tensor([list(prefix)])).logits[0, -1]
            top = torch.topk(logits.float(), 2).values
            margins.append(float(top[0] - top[1]))
    for handle in handles:
        handle.remove()
    del model
    gc.collect()
    return margins


def run_in_fp32(model: torch.nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Make `model` compute in float32 while its weights stay in their own dtype.

    Every module that holds parameters of its own gets float32 copies of them just before its
    forward, and its own tensors back just after; its floating-point tensor arguments are cast
    to float32. bf16 and fp16 values are exact in float32, so the model computes what the same
    model loaded in float32 computes, with one module's float32 copy alive at a time (the 1.5B
    target's LM head, 0.9 GB, the largest) beside the weights as loaded (memory-mapped from
    the folder's safetensors, never copied). A model already in float32 is left alone.

    Returns:
        The hooks' handles (`handle.remove()` undoes this).
    """
    if next(model.parameters()).dtype == torch.float32:
        return []
    stashed: dict[int, list[tuple[torch.nn.Parameter, torch.Tensor]]] = {}

    def upcast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.float()
        return value

    def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        own = [(p, p.data) for p in module.parameters(recurse=False)]
        stashed[id(module)] = own
        for param, data in own:
            param.data = data.float()
        return tuple(upcast(a) for a in args), {k: upcast(v) for k, v in kwargs.items()}

    def after(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        for param, data in stashed.pop(id(module)):
            param.data = data
        return output

    handles = []
    for module in model.modules():
        if any(True for _ in module.parameters(recurse=False)):
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after, with_kwargs=True))
    return handles


def generate_greedy(model_dir: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' `generate` greedy continuation (n tokens) of each prompt from the folder's
    bf16 weights; run it through `in_child` for a real model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
            outputs.append(out[0, len(ids) :].tolist())
    return outputs


def transformers_greedy(
    model_dir: str | Path, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int]
) -> list[list[int]]:
    """The model's greedy continuation of each prompt (token ids) in fp32 through
    transformers: `max_new_tokens[i]` argmax tokens for prompt i, EOS not treated as a stop
    (compare with requests that set `ignore_eos`). Loads and frees the model; meant for tiny
    models (each step reruns the whole context).

    Raises:
        ValueError: when the two sequences differ in length.
    """
    from transformers import AutoModelForCausalLM

    if len(prompts) != len(max_new_tokens):
        raise ValueError(f"{len(prompts)} prompts but {len(max_new_tokens)} lengths")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    outputs = []
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_new_tokens, strict=True):
            ids = list(prompt)
            for _ in range(n):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            outputs.append(ids[len(prompt) :])
    del model
    gc.collect()
    return outputs


def walk_divergences(
    prompt: Sequence[int],
    expected: Sequence[int],
    got: Sequence[int],
    continue_ar: ContinueFn | None,
) -> tuple[list[Divergence], int]:
    """Every divergence of `got` from the reference, continuing teacher-forced after each.

    After a divergence at output index i, the reference is `continue_ar(prompt + got[:i + 1],
    len(got) - i - 1)` aligned at i + 1. Without `continue_ar` the walk stops at the first
    divergence. Returns (divergences without margins, tokens of `got` checked).

    Raises:
        ValueError: `continue_ar` returned more tokens than asked for.
    """
    found: list[Divergence] = []
    reference, base = list(expected), 0
    while (d := first_divergence(reference, got[base:])) is not None:
        index = base + d.index
        found.append(Divergence(index, d.expected, d.got))
        rest = len(got) - index - 1
        if continue_ar is None or rest <= 0:
            return found, min(index + 1, len(got))
        reference = list(continue_ar([*prompt, *got[: index + 1]], rest))
        if len(reference) > rest:
            raise ValueError(f"continue_ar returned {len(reference)} tokens, asked for {rest}")
        base = index + 1
    return found, len(got)


def check_greedy(
    model_dir: str | Path,
    prompts: Sequence[Sequence[int]],
    expected: Sequence[Sequence[int]],
    got: Sequence[Sequence[int]],
    *,
    continue_ar: ContinueFn | None = None,
    eps: float = DEFAULT_MARGIN_EPS,
    margins: MarginsFn = fp32_top2_margins,
) -> GreedyCheck:
    """Compare greedy outputs per prompt under the ε rule.

    Args:
        model_dir: the target's folder (its fp32 margins judge each divergence).
        prompts, expected, got: per prompt, its token ids, the reference (AR) output and the
            output under test.
        continue_ar: the reference's greedy continuation of a context (see `ContinueFn`); with
            it every token of `got` is checked, without it each prompt stops at its first
            divergence.
        eps: logit units; a divergence whose fp32 margin is ≥ eps is a violation.
        margins: computes the margins (one call for all divergences; tests pass a fake).

    Returns:
        Every divergence with its margin, the checked/total token counts per prompt, and the
        violations as readable strings.
    """
    walked = [
        walk_divergences(p, e, g, continue_ar)
        for p, e, g in zip(prompts, expected, got, strict=True)
    ]
    todo = [(i, d) for i, (found, _) in enumerate(walked) for d in found]
    contexts = [[*prompts[i], *got[i][: d.index]] for i, d in todo]
    values = margins(model_dir, contexts) if todo else []
    judged: list[list[Divergence]] = [[] for _ in walked]
    violations = []
    for (i, d), margin in zip(todo, values, strict=True):
        judged[i].append(Divergence(d.index, d.expected, d.got, margin))
        if margin >= eps:
            violations.append(
                f"prompt {i}: token {d.index} expected {d.expected} got {d.got}, "
                f"fp32 top-2 margin {margin:.3f} >= eps {eps}"
            )
    checks = tuple(
        PromptCheck(tuple(judged[i]), checked, len(got[i])) for i, (_, checked) in enumerate(walked)
    )
    return GreedyCheck(checks, tuple(violations), eps)
