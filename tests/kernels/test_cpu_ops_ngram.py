"""`reconstruct_indices_from_tree_mask` against SGLang's Triton kernel (Triton CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
from sglang_source import triton_reference
from sglang_ssd_kernels.cpu_ops.ngram import reconstruct_indices_from_tree_mask


def random_tree_mask(gen: torch.Generator, bs: int, n: int) -> torch.Tensor:
    """QLEN masks of random trees: each node has a random earlier parent; row = ancestors + self."""
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        mask[b, 0, 0] = True
        for i in range(1, n):
            parent = int(torch.randint(i, (1,), generator=gen))
            mask[b, i] = mask[b, parent]
            mask[b, i, i] = True
    return mask.reshape(-1)


def run(impl, mask: torch.Tensor, seq_lens: torch.Tensor, bs: int, n: int):
    positions = torch.zeros(bs * n, dtype=seq_lens.dtype)
    links = torch.zeros(3, bs, n, dtype=seq_lens.dtype)
    impl(mask, seq_lens, positions, *links, bs, n)
    return positions, links


def triton_reconstruct(mask, seq_lens, positions, ri, rnt, rns, bs, n):
    kernel = triton_reference(
        "kernels/ops/speculative/reconstruct_tree.py", "_reconstruct_tree_mask_kernel"
    )
    kernel[(bs,)](mask, seq_lens, positions, ri, rnt, rns, n, 1 << (n - 1).bit_length())


@pytest.mark.parametrize(("bs", "n"), [(1, 1), (2, 4), (3, 8), (2, 13)])
@pytest.mark.parametrize("kind", ["tree", "arbitrary"])
def test_reconstruct_matches_triton(bs: int, n: int, kind: str) -> None:
    gen = torch.Generator().manual_seed(bs * 100 + n)
    if kind == "tree":
        mask = random_tree_mask(gen, bs, n)
    else:  # any bool matrix: the contract is defined on it too
        mask = torch.rand(bs * n * n, generator=gen) < 0.4
    seq_lens = torch.randint(1, 50, (bs,), generator=gen)
    got = run(reconstruct_indices_from_tree_mask, mask, seq_lens, bs, n)
    expected = run(triton_reconstruct, mask, seq_lens, bs, n)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_reconstruct_contract() -> None:
    """0 -> {1, 2}, 1 -> {3}: depth, first child, next sibling."""
    rows = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    mask = torch.tensor(rows, dtype=torch.bool).reshape(-1)
    positions, (ri, rnt, rns) = run(
        reconstruct_indices_from_tree_mask, mask, torch.tensor([10]), 1, 4
    )
    assert positions.tolist() == [10, 11, 11, 12]
    assert ri.tolist() == [[0, 1, 2, 3]]
    assert rnt.tolist() == [[1, 3, -1, -1]]
    assert rns.tolist() == [[-1, 2, -1, -1]]
