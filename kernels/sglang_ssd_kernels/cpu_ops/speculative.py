"""EAGLE-family speculative ops: draft tree construction, greedy tree verify, accept bookkeeping.

A draft tree for request `b` has `n = draft_token_num` nodes: node 0 is the root (the last
verified token), node `i >= 1` is `selected_index[b, i - 1]`. SGLang links the tree with three
`[bs, n]` arrays: `retrive_index` (flat index `b * n + i`), `retrive_next_token` (first child)
and `retrive_next_sibling` (next child of the same parent), `-1` meaning none. The semantics
follow the Triton kernels in `sglang/kernels/ops/speculative/` exactly; loops run over tree
depth or sibling rank, vectorised over the batch.
"""

from __future__ import annotations

import torch

from sglang_ssd_kernels.cpu_ops.kvcache import segment_coords

FULL_MASK = 0
QLEN_ONLY = 1


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the verify tree: attention mask, positions and child/sibling links (in place).

    The parent of node `i` is found through `parent_list[b, selected_index[b, i-1] // topk]`
    (a token index of the draft's top-k expansion) and located by its first occurrence in
    `selected_index[b]`; a node whose parent is not among the selected tokens stays unlinked
    and ends its ancestor walk there, as in SGLang's kernels.

    Args:
        parent_list: `[bs, topk * (depth - 1) + 1]` int64 (`[bs, 0]` when depth == 1).
        selected_index: `[bs, n - 1]` int64.
        verified_seq_len: `[bs]` int, committed prefix lengths.
        tree_mask: bool, written. QLEN_ONLY: `[>= bs * n * n]`, row `i` of request `b`'s
            `n x n` block marks what node `i` sees. FULL_MASK: `[sum(seq_len) * n + bs*n*n]`,
            request `b`'s block is `n x (seq_len_b + n)`; only the last `n` columns of each row
            are written (the caller pre-fills the prefix columns with True).
        positions: `[bs * n]` int, written: `seq_len + depth of node`.
        retrive_index: `[bs, n]`, written: `b * n + i`.
        retrive_next_token: `[bs, n]`, pre-filled with -1; first child written where one exists.
        retrive_next_sibling: `[bs, n]`, pre-filled with -1; next sibling written where one
            exists.
        topk: draft branching factor.
        depth: draft steps (bounds the ancestor walk).
        draft_token_num: `n`.
        tree_mask_mode: 0 = FULL_MASK, 1 = QLEN_ONLY.

    Raises:
        NotImplementedError: `tree_mask_mode` is QLEN_ONLY_BITPACKING (2) or unknown.
    """
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu: tree_mask_mode={tree_mask_mode} is not supported "
            "(only FULL_MASK=0 and QLEN_ONLY=1)"
        )
    n = draft_token_num
    bs = verified_seq_len.numel()
    seq_lens = verified_seq_len.reshape(-1).to(torch.int64)
    parent = _tree_parents(parent_list, selected_index, topk, n)  # [bs, n], -1 = unknown

    nodes = torch.arange(n)
    flat_index = torch.arange(bs).unsqueeze(1) * n + nodes
    retrive_index.view(bs, n).copy_(flat_index.to(retrive_index.dtype))
    first_child, next_sibling = _links_from_parents(parent)
    _write_where_linked(retrive_next_token.view(bs, n), first_child)
    _write_where_linked(retrive_next_sibling.view(bs, n), next_sibling)

    block, hops = _ancestor_block(parent, depth)
    positions.view(bs, n).copy_((seq_lens.unsqueeze(1) + hops).to(positions.dtype))
    _write_tree_mask(tree_mask, block, seq_lens, tree_mask_mode)


def _ancestor_block(parent: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What each node sees of its tree, and its depth, from the `[bs, n]` parent table.

    Node t marks itself and its ancestors, at most `depth` hops, stopping at the root or at a
    node whose parent is unknown (-1); every node sees the root.

    Returns:
        bool `[bs, n, n]` (row t: the nodes t sees) and int64 `[bs, n]` hops walked.
    """
    bs, n = parent.shape
    nodes = torch.arange(n)
    block = torch.zeros(bs, n, n, dtype=torch.bool)
    block[:, :, 0] = True
    rows = torch.arange(bs).unsqueeze(1).expand(bs, n)
    cur = nodes.expand(bs, n).clone()
    active = cur > 0
    hops = torch.zeros(bs, n, dtype=torch.int64)
    for _ in range(depth):
        if not bool(active.any()):
            break
        block[rows[active], nodes.expand(bs, n)[active], cur[active]] = True
        hops += active
        cur = torch.where(active, parent.gather(1, cur.clamp(min=0)), cur)
        active = active & (cur > 0)
    return block, hops


def _write_tree_mask(
    tree_mask: torch.Tensor, block: torch.Tensor, seq_lens: torch.Tensor, tree_mask_mode: int
) -> None:
    """Store the `[bs, n, n]` tree block in `tree_mask`'s QLEN_ONLY or FULL_MASK layout."""
    bs, n, _ = block.shape
    if tree_mask_mode == QLEN_ONLY:
        tree_mask.view(-1)[: bs * n * n] = block.reshape(-1)
        return
    nodes = torch.arange(n)
    row_start = (seq_lens * n).cumsum(0) - seq_lens * n + torch.arange(bs) * n * n
    width = (seq_lens + n).view(bs, 1, 1)
    flat = row_start.view(bs, 1, 1) + width * nodes.view(1, n, 1) + seq_lens.view(bs, 1, 1)
    tree_mask.view(-1)[(flat + nodes.view(1, 1, n)).reshape(-1)] = block.reshape(-1)


def _tree_parents(
    parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int, n: int
) -> torch.Tensor:
    """`[bs, n]` int64 parent node of each node: 0 for root children, -1 for node 0 / not found."""
    bs = selected_index.shape[0]
    selected = selected_index.reshape(bs, n - 1).to(torch.int64)
    parent = torch.full((bs, n), -1, dtype=torch.int64)
    if n == 1:
        return parent
    parent_tb = selected // topk  # [bs, n-1]
    parent[:, 1:] = 0
    deep = parent_tb > 0
    if bool(deep.any()):
        token = parent_list.to(torch.int64).gather(1, parent_tb.clamp(min=0) * deep)
        hit = selected.unsqueeze(1) == token.unsqueeze(2)  # [bs, node-1, candidate]
        found = hit.any(2)
        where = hit.to(torch.int8).argmax(2) + 1  # first occurrence
        parent[:, 1:] = torch.where(deep, torch.where(found, where, -1), 0)
    return parent


def _links_from_parents(parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First child and next sibling (`[bs, n]` int64, -1 = none) from a `[bs, n]` parent array."""
    bs, n = parent.shape
    nodes = torch.arange(n)
    sentinel = torch.full((bs, n, n), n, dtype=torch.int64)
    # child[b, p, k]: node k's parent is p
    child = parent.unsqueeze(1) == nodes.view(1, n, 1)
    first = torch.where(child, nodes.view(1, 1, n), sentinel).min(2).values
    # sibling[b, i, k]: k > i shares i's (known) parent
    sib = (parent.unsqueeze(1) == parent.unsqueeze(2)) & (nodes.view(1, 1, n) > nodes.view(1, n, 1))
    sib &= (parent >= 0).unsqueeze(2)
    nxt = torch.where(sib, nodes.view(1, 1, n), sentinel).min(2).values
    none = torch.tensor(-1, dtype=torch.int64)
    return torch.where(first < n, first, none), torch.where(nxt < n, nxt, none)


def _write_where_linked(out: torch.Tensor, links: torch.Tensor) -> None:
    linked = links >= 0
    out[linked] = links[linked].to(out.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verify: accept the longest root path whose tokens equal the target's argmax.

    From the root, each step takes the first child (in sibling order) whose draft token equals
    the target's prediction at the last accepted node, for at most `num_spec_step - 1` steps.

    Args:
        predicts: `[bs * n]` int32, written at accepted nodes (flat index): the target token
            there; the last accepted node gets the bonus token.
        accept_index: `[bs, num_spec_step]` int32, pre-filled with -1; slot 0 gets the root,
            slot `k` the flat index of the k-th accepted draft node.
        accept_token_num: `[bs]` int32, written: accepted draft tokens (bonus excluded).
        candidates: `[bs, n]` draft tokens (node 0 is the root's token).
        retrive_index: `[bs, n]` flat node index.
        retrive_next_token: `[bs, n]` first child, -1 = none.
        retrive_next_sibling: `[bs, n]` next sibling, -1 = none.
        target_predict: `[bs, n]` target argmax at each node.
    """
    bs, n = candidates.shape
    num_spec_step = accept_index.shape[1]
    flat_target = target_predict.reshape(-1).to(torch.int64)
    ridx = retrive_index.to(torch.int64)
    next_token = retrive_next_token.to(torch.int64)
    next_sibling = retrive_next_sibling.to(torch.int64)
    cand = candidates.to(torch.int64)

    # chosen[b, p]: first child of p, in sibling order, matching the target token at p.
    want = flat_target[ridx]  # [bs, n] target token at each node
    chosen = torch.full((bs, n), -1, dtype=torch.int64)
    probe = next_token.clone()
    for _ in range(n):
        live = (probe >= 0) & (chosen < 0)
        if not bool(live.any()):
            break
        safe = probe.clamp(min=0)
        match = live & (cand.gather(1, safe) == want)
        chosen = torch.where(match, probe, chosen)
        probe = torch.where(live & ~match, next_sibling.gather(1, safe), -1)

    flat_predicts = predicts.view(-1)
    batch = torch.arange(bs)
    last = ridx[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.int64)
    cur = torch.zeros(bs, dtype=torch.int64)
    active = torch.ones(bs, dtype=torch.bool)
    for step in range(1, num_spec_step):
        nxt = chosen[batch, cur]
        active = active & (nxt >= 0)
        if not bool(active.any()):
            break
        b = batch[active]
        node = nxt[active]
        flat_predicts[last[active]] = flat_target[last[active]].to(predicts.dtype)
        accept_index[b, step] = ridx[b, node].to(accept_index.dtype)
        last[active] = ridx[b, node]
        cur[active] = node
        num += active
    accept_token_num.copy_(num.to(accept_token_num.dtype))
    flat_predicts[last] = flat_target[last].to(predicts.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """`bonus_tokens[i] = accept_tokens.flat[i * accept_stride + accept_lens[i] - 1]` (in place).

    Args:
        accept_tokens: `[bs, accept_stride]` (read flat).
        accept_lens: `[bs]` int, accepted tokens per request, bonus included (>= 1).
        bonus_tokens: `[bs]`, written.
        accept_stride: row width of `accept_tokens`.
    """
    bs = accept_lens.numel()
    idx = torch.arange(bs) * accept_stride + accept_lens.reshape(-1).to(torch.int64) - 1
    bonus_tokens.view(-1).copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact the KV slots of accepted tokens, in order, skipping rejected (-1) entries.

    Args:
        accept_index: `[bs, num_spec_step]` (read flat) indices into `out_cache_loc`, -1 = none.
        out_cache_loc: `[bs * n]` int64 KV slots of the verified draft tokens.
        accept_out_cache_loc: `[>= number accepted]` int64; the first entries are written.
    """
    flat = accept_index.reshape(-1).to(torch.int64)
    dst = torch.cumsum(flat != -1, 0) - 1
    keep = flat > -1
    accept_out_cache_loc.view(-1)[dst[keep]] = out_cache_loc.reshape(-1)[flat[keep]].to(
        accept_out_cache_loc.dtype
    )


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each request's extend segment left by one and append its new token (in place).

    Args:
        input_ids: `[num_tokens]` int64, modified in place.
        extend_start_loc: `[bs]` int, segment starts.
        extend_seq_lens: `[bs]` int, segment lengths.
        topk_index: `[bs]` new token per request.
        select_index: `[bs]` int64 or None; where to write the new token (default: the last
            position of the segment).
    """
    starts = extend_start_loc.reshape(-1).to(torch.int64)
    lens = extend_seq_lens.reshape(-1).to(torch.int64)
    shifted_lens = (lens - 1).clamp(min=0)
    seg, col = segment_coords(starts, starts + shifted_lens)
    if seg.numel():
        input_ids[col] = input_ids[col + 1]
    has_tokens = lens > 0
    if select_index is not None:
        dst = select_index.reshape(-1).to(torch.int64)
    else:
        dst = starts + lens - 1
    input_ids[dst[has_tokens]] = topk_index.reshape(-1)[has_tokens].to(input_ids.dtype)
