"""N-gram speculative op: recover the verify tree's links from its QLEN-layout mask."""

from __future__ import annotations

import torch


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Positions and child/sibling links of each draft node from its ancestor mask (in place).

    With `n = draft_token_num` and `A[b, i, j] = tree_mask[b, i, j] and j < i` (j is a strict
    ancestor of i): `positions = seq_len + #ancestors`, `retrive_index = b * n + i`, the parent
    is the largest ancestor, the first child is the smallest `k > i` with `A[b, k, i]`, and the
    next sibling the smallest `k > i` with the same (existing) parent. This is the contract of
    SGLang's `_reconstruct_tree_mask_kernel` (kernels/ops/speculative/reconstruct_tree.py).

    Args:
        tree_mask: `[>= bs * n * n]` bool, row-major `(b, i, j)`.
        verified_seq_len: `[bs]` int, committed prefix lengths.
        positions: `[bs * n]` int, written.
        retrive_index: `[bs, n]` int, written.
        retrive_next_token: `[bs, n]` int, written (-1 = none).
        retrive_next_sibling: `[bs, n]` int, written (-1 = none).
        batch_size: `bs`.
        draft_token_num: `n`.
    """
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    nodes = torch.arange(n)
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).to(torch.bool)
    ancestors = mask & (nodes.view(1, 1, n) < nodes.view(1, n, 1))
    depth = ancestors.sum(2)
    seq_lens = verified_seq_len.reshape(-1)[:bs].to(torch.int64)
    positions.view(-1)[: bs * n] = (depth + seq_lens.unsqueeze(1)).reshape(-1).to(positions.dtype)
    flat_index = torch.arange(bs).unsqueeze(1) * n + nodes
    retrive_index.view(bs, n).copy_(flat_index.to(retrive_index.dtype))

    none = torch.tensor(-1, dtype=torch.int64)
    parent = torch.where(ancestors, nodes.view(1, 1, n), none).max(2).values  # [bs, n]
    sentinel = torch.tensor(n, dtype=torch.int64)
    # first child of i: min k with ancestors[k, i] (transpose to index by i)
    first_child = torch.where(ancestors, nodes.view(1, n, 1), sentinel).min(1).values
    retrive_next_token.view(bs, n).copy_(
        torch.where(first_child < n, first_child, none).to(retrive_next_token.dtype)
    )
    later = nodes.view(1, 1, n) > nodes.view(1, n, 1)  # [i, k]: k > i
    same_parent = (parent.unsqueeze(2) == parent.unsqueeze(1)) & later
    sibling = torch.where(same_parent, nodes.view(1, 1, n), sentinel).min(2).values
    sibling = torch.where((parent >= 0) & (sibling < n), sibling, none)
    retrive_next_sibling.view(bs, n).copy_(sibling.to(retrive_next_sibling.dtype))
