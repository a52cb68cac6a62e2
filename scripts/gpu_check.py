"""`make gpu-check`: the checks that need a GPU, sized for the lent H200 (DESIGN.md section 3).

Runs, on CUDA against the CPU reference:
- `sglang_ssd.saguaro.verify`: greedy rows must match the CPU bit for bit; sampled rows (different
  RNG streams per device) must both be lossless (the first emitted token ~ p) and agree with the
  analytic acceptance rate and with each other, within 5 sigma;
- `sglang_ssd_kernels.branch_attention` (both strategies, fp32 and bf16) against the float64
  dense reference computed on the CPU;
- FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` custom-mask path against the same reference,
  when `flashinfer` imports.
Without CUDA the CUDA rows print SKIP and the CPU rows still run. Prints a pass/fail table and
exits 1 if any check fails. Imports only torch, `sglang_ssd.saguaro` and `sglang_ssd_kernels`
(the H200 has no sglang, pyzmq or msgspec), from this checkout if they are not installed.
Finishes in well under 3 minutes.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "kernels"):  # run from a bare checkout (nothing installed)
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

SIGMAS = 5.0


class Skip(Exception):
    """A check that cannot run here (no CUDA, package missing)."""


RESULTS: list[tuple[str, str, float, str]] = []


def run_check(name: str, fn: Callable[[], str]) -> None:
    start = time.perf_counter()
    try:
        detail = fn()
        status = "PASS"
    except Skip as skip:
        status, detail = "SKIP", str(skip)
    except Exception as error:  # a failing check must not stop the others
        status = "FAIL"
        detail = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    RESULTS.append((name, status, time.perf_counter() - start, detail))
    print(f"[{status}] {name}: {detail}", flush=True)


def need_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    return torch.device("cuda")


def import_saguaro():
    try:
        from sglang_ssd.saguaro import SamplingBatch, verify
    except ImportError as error:
        raise Skip(f"sglang_ssd.saguaro not importable ({error})") from error
    return SamplingBatch, verify


def import_branch_attention():
    try:
        from sglang_ssd_kernels import branch_attention as module
    except ImportError as error:
        raise Skip(f"sglang_ssd_kernels.branch_attention not importable ({error})") from error
    return module


# ---------------------------------------------------------------------------------------------
# saguaro.verify


def check_verify_greedy() -> str:
    device = need_cuda()
    sampling_cls, verify = import_saguaro()
    gen = torch.Generator().manual_seed(0)
    batch, depth, vocab = 256, 5, 151936 // 8
    logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    drafts = torch.randint(0, vocab, (batch, depth), generator=gen)
    # Most draft tokens are the argmax so that accept lengths spread over 0..D.
    take_argmax = torch.rand(batch, depth, generator=gen) < 0.8
    drafts = torch.where(take_argmax, logits[:, :depth].argmax(-1), drafts)
    sampling = sampling_cls.uniform(batch, temperature=0.0, top_k=1)
    cpu = verify(logits, drafts, None, sampling)
    cuda = verify(logits.to(device), drafts.to(device), None, sampling.to(device))
    for field in ("accept_len", "bonus_token", "emitted"):
        a, b = getattr(cpu, field), getattr(cuda, field).cpu()
        if not torch.equal(a, b):
            bad = (a != b).reshape(batch, -1).any(1).nonzero().squeeze(1)[:5].tolist()
            raise AssertionError(f"{field} differs CPU vs CUDA in rows {bad}")
    hist = torch.bincount(cpu.accept_len, minlength=depth + 1).tolist()
    return f"{batch} rows x D={depth}, V={vocab}: identical; accept_len histogram {hist}"


def _sampled_case(batch_per_case: int, seed: int):
    """4 (p, q) pairs replicated; drafts sampled from q with their own CPU generator."""
    gen = torch.Generator().manual_seed(seed)
    cases, depth, vocab = 4, 3, 16
    target_logits = torch.randn(cases, depth + 1, vocab, generator=gen) * 1.5
    draft_logits = target_logits[:, :depth] + torch.randn(cases, depth, vocab, generator=gen)
    q = torch.softmax(draft_logits, dim=-1)
    rows = cases * batch_per_case
    target = target_logits.repeat_interleave(batch_per_case, 0)
    q_rows = q.repeat_interleave(batch_per_case, 0)
    drafts = torch.multinomial(q_rows.reshape(-1, vocab), 1, generator=gen).view(rows, depth)
    # Every 4th row is a point mass (n-gram/random draft): its token is uniform, q ignored.
    point_mass = torch.arange(rows) % 4 == 3
    uniform = torch.randint(0, vocab, (rows, depth), generator=gen)
    drafts = torch.where(point_mass.unsqueeze(1), uniform, drafts)
    return target, drafts, q_rows, point_mass, torch.softmax(target_logits, -1), q


def _check_lossless(result, point_mass, p, q, batch_per_case: int, label: str) -> list[float]:
    """First emitted token ~ p[case, 0]; P(accept >= 1) = sum min(p, q) (sampled rows)."""
    cases, vocab = p.shape[0], p.shape[-1]
    first = result.emitted[:, 0].cpu().view(cases, batch_per_case)
    accept = result.accept_len.cpu().view(cases, batch_per_case)
    pm = point_mass.view(cases, batch_per_case)
    worst = 0.0
    for c in range(cases):
        counts = torch.bincount(first[c], minlength=vocab).double()
        freq = counts / batch_per_case
        target = p[c, 0].double()
        sigma = (target * (1 - target) / batch_per_case).sqrt() + 1e-4
        z = ((freq - target).abs() / sigma).max().item()
        worst = max(worst, z)
        if z > SIGMAS:
            raise AssertionError(f"{label}: case {c} first token deviates from p by {z:.1f} sigma")
        sampled = accept[c][~pm[c]]
        rate = (sampled >= 1).double().mean().item()
        expected = torch.minimum(p[c, 0], q[c, 0]).sum().item()
        sigma = (expected * (1 - expected) / sampled.numel()) ** 0.5 + 1e-4
        if abs(rate - expected) / sigma > SIGMAS:
            raise AssertionError(f"{label}: case {c} P(accept>=1) {rate:.4f} vs {expected:.4f}")
    return [worst]


def check_verify_sampled(device_name: str) -> Callable[[], str]:
    def check() -> str:
        device = need_cuda() if device_name == "cuda" else torch.device("cpu")
        sampling_cls, verify = import_saguaro()
        per_case = 20000
        target, drafts, q_rows, point_mass, p, q = _sampled_case(per_case, seed=1)
        sampling = sampling_cls.uniform(target.shape[0], temperature=1.0).to(device)
        gen = torch.Generator(device=device).manual_seed(123)
        result = verify(
            target.to(device),
            drafts.to(device),
            q_rows.to(device),
            sampling,
            point_mass=point_mass.to(device),
            generator=gen,
        )
        worst = _check_lossless(result, point_mass, p, q, per_case, device_name)[0]
        return f"{target.shape[0]} rows: lossless within {worst:.2f} sigma (limit {SIGMAS})"

    return check


def check_verify_sampled_cpu_vs_cuda() -> str:
    device = need_cuda()
    sampling_cls, verify = import_saguaro()
    per_case = 20000
    target, drafts, q_rows, point_mass, _, _ = _sampled_case(per_case, seed=2)
    sampling = sampling_cls.uniform(target.shape[0], temperature=1.0)
    hists = []
    for dev in (torch.device("cpu"), device):
        gen = torch.Generator(device=dev).manual_seed(7)
        result = verify(
            target.to(dev),
            drafts.to(dev),
            q_rows.to(dev),
            sampling.to(dev),
            point_mass=point_mass.to(dev),
            generator=gen,
        )
        hists.append(torch.bincount(result.accept_len.cpu(), minlength=4).double())
    n = target.shape[0]
    a, b = hists[0] / n, hists[1] / n
    sigma = ((a * (1 - a) / n) * 2).sqrt() + 1e-4
    z = ((a - b).abs() / sigma).max().item()
    if z > SIGMAS:
        raise AssertionError(f"accept_len histograms differ by {z:.1f} sigma: {a} vs {b}")
    return f"accept_len distribution CPU {a.tolist()} vs CUDA within {z:.2f} sigma"


# ---------------------------------------------------------------------------------------------
# branch attention


def _tree_layout(seed: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """A tree-decode-like layout: R requests, each prefix + glue + branches, random fork depths."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = 4096
    perm = torch.randperm(num_slots, generator=gen)
    used = 0
    qo, kv, indices, masks = [0], [0], [], []
    for _ in range(4):
        prefix = int(torch.randint(50, 400, (1,), generator=gen))
        branches = int(torch.randint(1, 12, (1,), generator=gen))
        steps = int(torch.randint(1, 5, (1,), generator=gen))
        ctx = perm[used : used + prefix]
        used += prefix
        own = perm[used : used + branches * steps].view(branches, steps)
        used += branches * steps
        lens = torch.randint(prefix - 4, prefix + 1, (branches,), generator=gen)
        visible = torch.arange(prefix).unsqueeze(0) < lens.unsqueeze(1)
        own_mask = torch.eye(branches, dtype=torch.bool).repeat_interleave(steps, dim=1)
        masks.append(torch.cat([visible, own_mask], 1).reshape(-1))
        indices.append(torch.cat([ctx, own.reshape(-1)]))
        qo.append(qo[-1] + branches)
        kv.append(kv[-1] + prefix + branches * steps)
    n = qo[-1]
    q = torch.randn(n, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    return (
        q,
        k,
        v,
        torch.tensor(qo, dtype=torch.int32),
        torch.tensor(kv, dtype=torch.int32),
        torch.cat(indices).to(torch.int32),
        torch.cat(masks),
        num_slots,
    )


CONFIGS = [(14, 2, 64), (32, 8, 128)]  # (H, Hkv, d): the 0.5B draft, a Llama-like model


def _reference(module, case):
    q, k, v, qo, kv, idx, mask, slots = case
    dense = module.dense_mask_from_layout(qo, kv, idx, mask, slots)
    return module.dense_reference(q.double(), k.double(), v.double(), dense, q.shape[-1] ** -0.5)


def check_branch_attention_cpu() -> str:
    module = import_branch_attention()
    worst = 0.0
    for seed, (h, hkv, d) in enumerate(CONFIGS):
        case = _tree_layout(seed, h, hkv, d, torch.float32)
        ref = _reference(module, case)
        q, k, v, qo, kv, idx, mask, _ = case
        for strategy in ("padded", "segments"):
            out = module.branch_attention(q, k, v, qo, kv, idx, mask, d**-0.5, strategy=strategy)
            err = (out.double() - ref).abs().max().item()
            worst = max(worst, err)
            if err > 1e-4:
                raise AssertionError(f"CPU {strategy} H={h} d={d}: max error {err:.2e}")
    return f"fp32 vs float64 dense reference: max error {worst:.2e}"


def check_branch_attention_cuda() -> str:
    device = need_cuda()
    module = import_branch_attention()
    lines = []
    for seed, (h, hkv, d) in enumerate(CONFIGS):
        for dtype, tol in ((torch.float32, 2e-4), (torch.bfloat16, 3e-2)):
            case = _tree_layout(seed, h, hkv, d, dtype)
            ref = _reference(module, case)
            q, k, v, qo, kv, idx, mask, _ = case
            worst = 0.0
            for strategy in ("padded", "segments"):
                out = module.branch_attention(
                    q.to(device),
                    k.to(device),
                    v.to(device),
                    qo.to(device),
                    kv.to(device),
                    idx.to(device),
                    mask.to(device),
                    d**-0.5,
                    strategy=strategy,
                )
                err = (out.cpu().double() - ref).abs().max().item()
                worst = max(worst, err)
                if not err <= tol:
                    raise AssertionError(
                        f"CUDA {strategy} {dtype} H={h} d={d}: max error {err:.2e} > {tol}"
                    )
            lines.append(f"{str(dtype)[6:]} H{h}/d{d} {worst:.1e}")
    return "max error vs reference: " + ", ".join(lines)


def check_branch_attention_flashinfer() -> str:
    device = need_cuda()
    module = import_branch_attention()
    try:
        import flashinfer
    except ImportError as error:
        raise Skip(f"flashinfer not importable ({error})") from error
    lines = [f"flashinfer {getattr(flashinfer, '__version__', '?')}"]
    for seed, (h, hkv, d) in enumerate(CONFIGS):
        case = _tree_layout(seed, h, hkv, d, torch.bfloat16)
        ref = _reference(module, case)
        q, k, v, qo, kv, idx, mask, _ = case
        out = module.branch_attention_flashinfer(
            q.to(device),
            k.to(device),
            v.to(device),
            qo.to(device),
            kv.to(device),
            idx.to(device),
            mask.to(device),
            d**-0.5,
        )
        err = (out.cpu().double() - ref).abs().max().item()
        if not err <= 3e-2:
            raise AssertionError(f"FlashInfer H={h} d={d}: max error {err:.2e}")
        lines.append(f"H{h}/d{d} {err:.1e}")
    return "bf16 max error vs reference: " + ", ".join(lines)


def check_environment() -> str:
    parts = [f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        parts.append(f"{props.name}, {props.total_memory / 2**30:.0f} GiB")
    else:
        parts.append("no CUDA")
    return ", ".join(parts)


def main() -> int:
    start = time.perf_counter()
    run_check("environment", check_environment)
    run_check("verify greedy: CUDA == CPU exactly", check_verify_greedy)
    run_check("verify sampled lossless (CPU)", check_verify_sampled("cpu"))
    run_check("verify sampled lossless (CUDA)", check_verify_sampled("cuda"))
    run_check("verify sampled: CUDA vs CPU distribution", check_verify_sampled_cpu_vs_cuda)
    run_check("branch_attention CPU vs dense reference", check_branch_attention_cpu)
    run_check("branch_attention CUDA vs CPU reference", check_branch_attention_cuda)
    run_check("FlashInfer custom mask vs CPU reference", check_branch_attention_flashinfer)

    width = max(len(name) for name, *_ in RESULTS)
    print()
    print(f"{'check':<{width}}  status  seconds  detail")
    for name, status, seconds, detail in RESULTS:
        print(f"{name:<{width}}  {status:<6}  {seconds:7.2f}  {detail}")
    counts = {s: sum(status == s for _, status, *_ in RESULTS) for s in ("PASS", "SKIP", "FAIL")}
    total = time.perf_counter() - start
    passed, skipped, failed = counts["PASS"], counts["SKIP"], counts["FAIL"]
    print(f"\n{passed} passed, {skipped} skipped, {failed} failed in {total:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
