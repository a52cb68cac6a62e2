"""EAGLE-family speculative ops against SGLang's Triton kernels (Triton CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
from sglang_source import triton_reference
from sglang_ssd_kernels.cpu_ops import speculative

FULL_MASK, QLEN_ONLY = 0, 1


SPEC_TREE = "kernels/ops/speculative/spec_tree.py"
EAGLE = "kernels/ops/speculative/eagle.py"


def eagle_tree(gen: torch.Generator, bs: int, topk: int, depth: int, n: int, valid: bool):
    """Random draft trees in EAGLE's layout (organize_draft_results).

    Candidates: step 0 has `topk` (indices 0..topk-1), each later step `topk * topk`; candidate
    `c` has parent slot `c // topk` in `parent_list`, whose entry `1 + (s-1)*topk + j` is the
    j-th candidate of step s-1 expanded at step s. `valid` keeps every selected node's parent
    selected (as top-k over cumulative scores does); otherwise parents may be missing.
    """
    width = topk * (depth - 1) + 1
    parent_list = torch.full((bs, width), -1, dtype=torch.int64)
    selected = torch.empty(bs, n - 1, dtype=torch.int64)
    step_ranges = [(0, topk)] + [
        (topk + (s - 1) * topk * topk, topk + s * topk * topk) for s in range(1, depth)
    ]
    for b in range(bs):
        expanded = [list(range(topk))]
        for s in range(1, depth):
            lo, hi = step_ranges[s - 1]
            pool = torch.randperm(hi - lo, generator=gen)[:topk] + lo
            if s == 1:
                pool = torch.arange(topk)
            parent_list[b, 1 + (s - 1) * topk : 1 + s * topk] = pool
            expanded.append(pool.tolist())
        total = step_ranges[-1][1]
        if valid:
            chosen: set[int] = set()
            frontier = list(range(topk))
            while len(chosen) < n - 1 and frontier:
                pick = frontier.pop(int(torch.randint(len(frontier), (1,), generator=gen)))
                chosen.add(pick)
                s = next(i for i, (lo, hi) in enumerate(step_ranges) if lo <= pick < hi)
                if s + 1 < depth and pick in expanded[s + 1]:
                    j = expanded[s + 1].index(pick)
                    lo = step_ranges[s + 1][0] + j * topk
                    frontier += list(range(lo, lo + topk))
            picks = sorted(chosen)
            picks += sorted(set(range(total)) - chosen)[: n - 1 - len(picks)]
        else:
            picks = sorted(torch.randperm(total, generator=gen)[: n - 1].tolist())
        selected[b] = torch.tensor(sorted(picks))
    return parent_list, selected


def run_build(impl, parent_list, selected, seq_lens, topk, depth, n, mode):
    bs = seq_lens.numel()
    if mode == QLEN_ONLY:
        mask = torch.full((bs * n * n + 5,), True)
    else:
        mask = torch.full((int(seq_lens.sum()) * n + bs * n * n,), True)
    positions = torch.empty(bs * n, dtype=torch.int64)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)
    impl(parent_list, selected, seq_lens, mask, positions, *retrieve, topk, depth, n, mode)
    return mask, positions, retrieve


def triton_build(
    parent_list, selected, seq_lens, mask, positions, ri, rnt, rns, topk, depth, n, mode
):
    kernel = triton_reference(SPEC_TREE, "sgl_build_tree_kernel_efficient_triton")
    prefix_sum = torch.cumsum(seq_lens, 0) - seq_lens
    kernel[(seq_lens.numel(),)](
        parent_list,
        selected,
        seq_lens,
        prefix_sum,
        mask,
        positions,
        ri,
        rnt,
        rns,
        topk=topk,
        depth=depth,
        draft_token_num=n,
        tree_mask_mode=mode,
        batch_size=seq_lens.numel(),
        parent_list_stride=parent_list.stride(0) if parent_list.shape[1] else 0,
        selected_index_stride=selected.stride(0),
    )


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
@pytest.mark.parametrize(
    ("topk", "depth", "n", "valid"),
    [(1, 4, 5, True), (2, 3, 6, True), (4, 3, 8, True), (3, 4, 8, False), (2, 1, 3, True)],
)
def test_build_tree_matches_triton(topk, depth, n, valid, mode) -> None:
    gen = torch.Generator().manual_seed(topk * 10 + depth + n)
    bs = 3
    parent_list, selected = eagle_tree(gen, bs, topk, depth, n, valid)
    if depth == 1:
        parent_list = parent_list[:, :0]
    seq_lens = torch.randint(1, 9, (bs,), generator=gen)
    got = run_build(
        speculative.build_tree_kernel_efficient_cpu,
        parent_list,
        selected,
        seq_lens,
        topk,
        depth,
        n,
        mode,
    )
    expected = run_build(triton_build, parent_list, selected, seq_lens, topk, depth, n, mode)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_build_tree_chain_contract() -> None:
    """topk=1: a chain; node i sees nodes 0..i, sits at seq_len + i, links to i+1."""
    n, seq_len = 5, 7
    parent_list = torch.tensor([[-1, 0, 1, 2]])
    selected = torch.tensor([[0, 1, 2, 3]])
    mask, positions, (ri, rnt, rns) = run_build(
        speculative.build_tree_kernel_efficient_cpu,
        parent_list,
        selected,
        torch.tensor([seq_len]),
        1,
        4,
        n,
        QLEN_ONLY,
    )
    assert torch.equal(mask[: n * n].view(n, n), torch.ones(n, n, dtype=torch.bool).tril())
    assert positions.tolist() == [seq_len + i for i in range(n)]
    assert ri.tolist() == [list(range(n))]
    assert rnt.tolist() == [[1, 2, 3, 4, -1]]
    assert rns.tolist() == [[-1] * n]


def test_build_tree_rejects_bitpacking() -> None:
    with pytest.raises(NotImplementedError, match="tree_mask_mode"):
        run_build(
            speculative.build_tree_kernel_efficient_cpu,
            torch.zeros(1, 2, dtype=torch.int64),
            torch.zeros(1, 2, dtype=torch.int64),
            torch.tensor([3]),
            1,
            2,
            3,
            2,
        )


@pytest.mark.parametrize(("topk", "depth", "n"), [(1, 4, 5), (2, 3, 6), (4, 4, 10)])
@pytest.mark.parametrize("seed", range(3))
def test_verify_tree_greedy_matches_triton(topk, depth, n, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs = 4
    parent_list, selected = eagle_tree(gen, bs, topk, depth, n, valid=True)
    _, _, (ri, rnt, rns) = run_build(
        speculative.build_tree_kernel_efficient_cpu,
        parent_list,
        selected,
        torch.full((bs,), 5),
        topk,
        depth,
        n,
        QLEN_ONLY,
    )
    vocab = 2 + seed  # small vocab: many matches, some rejections
    candidates = torch.randint(vocab, (bs, n), generator=gen)
    target = torch.randint(vocab, (bs, n), generator=gen)
    steps = depth + 1

    def outputs():
        return (
            torch.zeros(bs * n, dtype=torch.int32),
            torch.full((bs, steps), -1, dtype=torch.int32),
            torch.zeros(bs, dtype=torch.int32),
        )

    got, expected = outputs(), outputs()
    speculative.verify_tree_greedy_cpu(*got, candidates, ri, rnt, rns, target)
    triton_reference(SPEC_TREE, "verify_tree_greedy_kernel_triton")[(bs,)](
        *expected,
        candidates,
        ri,
        rnt,
        rns,
        target,
        batch_size=bs,
        num_speculative_tokens=steps,
        num_draft_tokens=n,
    )
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_verify_tree_greedy_sibling_contract() -> None:
    """Root has children 1 (token 7) and 2 (token 9); the target wants 9 -> node 2, then stop."""
    ri = torch.tensor([[0, 1, 2]])
    rnt = torch.tensor([[1, -1, -1]])
    rns = torch.tensor([[-1, 2, -1]])
    candidates = torch.tensor([[5, 7, 9]])
    target = torch.tensor([[9, 1, 4]])
    predicts = torch.zeros(3, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    speculative.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=ri,
        retrive_next_token=rnt,
        retrive_next_sibling=rns,
        target_predict=target,
    )
    assert accept_index.tolist() == [[0, 2, -1]]
    assert accept_num.tolist() == [1]
    assert predicts.tolist() == [9, 0, 4]  # accepted 9 at the root, bonus 4 at node 2


def test_fill_bonus_tokens_matches_triton() -> None:
    gen = torch.Generator().manual_seed(0)
    bs, stride = 5, 4
    tokens = torch.randint(100, (bs, stride), generator=gen, dtype=torch.int32)
    lens = torch.randint(1, stride + 1, (bs,), generator=gen, dtype=torch.int32)
    got = torch.zeros(bs, dtype=torch.int32)
    expected = torch.zeros(bs, dtype=torch.int32)
    speculative.fill_bonus_tokens_cpu(tokens, lens, got, stride)
    triton_reference(EAGLE, "fill_bonus_tokens")[(bs,)](tokens, lens, expected, stride)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("seed", range(3))
def test_fill_accept_out_cache_loc_matches_triton(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs, steps, n = 3, 4, 5
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(torch.randint(1, steps + 1, (1,), generator=gen))
        accept_index[b, :k] = torch.sort(torch.randperm(n, generator=gen)[:k]).values + b * n
    out_cache_loc = torch.randperm(100, generator=gen)[: bs * n]
    got = torch.full((bs * steps,), -3, dtype=torch.int64)
    expected = got.clone()
    speculative.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    size = accept_index.numel()
    triton_reference(EAGLE, "fill_accept_out_cache_loc")[(size,)](
        accept_index, out_cache_loc, expected, 16
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids_matches_triton(with_select: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    lens = torch.tensor([3, 1, 0, 5])
    starts = torch.cumsum(lens, 0) - lens
    ids = torch.randint(1000, (int(lens.sum()),), generator=gen)
    topk_index = torch.tensor([901, 902, 903, 904])
    select = (starts + (lens - 1).clamp(min=0)) if with_select else None
    got, expected = ids.clone(), ids.clone()
    speculative.rotate_input_ids_cpu(got, starts.int(), lens, topk_index, select)
    triton_reference("kernels/ops/speculative/multi_layer_eagle.py", "rotate_input_ids_kernel")[
        (lens.numel(),)
    ](expected, starts.int(), lens, topk_index, select, BLOCK_SIZE=8)
    assert torch.equal(got, expected)
