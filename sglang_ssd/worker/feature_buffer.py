"""The target's EAGLE-3 features per request, from its forwards until the next Step ships them.

An EAGLE-3 head drafts the token after position p from the target's features f_p (the captured
layers' inputs at p, `eagle3_capture`). The target computes them for free in its own forwards:
a prefill (chunk) yields the features of its extend positions, a verify round those of the root
and the k accepted tokens (the bonus token's come with the next round, where it is the root),
a plain round its one position. `FeatureBuffer` keeps them per request, in position order, and
`take` packs them for `Step.features`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_ssd.transport import FeatureSpan

MAX_SPAN = 65536  # rows per `FeatureSpan` (the protocol's bound); longer runs are split


class FeatureBuffer:
    """Per request, the features [n, F] of positions start .. start + n − 1 not sent yet."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[int, torch.Tensor]] = {}

    def add(self, rid: str, start: int, features: torch.Tensor) -> None:
        """Append `features` [n, F] of positions start .. start + n − 1 (n may be 0).

        A run that does not continue the buffered one (a re-prefill from position 0, after a
        retraction) replaces it: the speculator ignores positions it already holds and refuses
        gaps, so the newest contiguous run is what it can use. The rows are copied: a forward's
        capture buffer may be reused by the next forward (CUDA graphs)."""
        if features.shape[0] == 0:
            return
        held = self.spans.get(rid)
        if held is not None and held[0] + held[1].shape[0] == start:
            self.spans[rid] = (held[0], torch.cat([held[1], features]))
        else:
            self.spans[rid] = (start, features.clone())

    def drop(self, rid: str) -> None:
        """Forget `rid`'s features (it closed, or the speculator lost it)."""
        self.spans.pop(rid, None)

    def keep_from_start(self, rid: str) -> None:
        """`rid` is re-opened on the speculator, which then holds no features of it: keep its
        buffered run only if that starts at position 0 (a fresh prefill's)."""
        held = self.spans.get(rid)
        if held is not None and held[0] != 0:
            del self.spans[rid]

    def clear(self) -> None:
        self.spans.clear()

    def __len__(self) -> int:
        return len(self.spans)

    def take(self, rids: Sequence[str]) -> tuple[list[FeatureSpan], torch.Tensor | None]:
        """Remove and return the buffered features of `rids` (in that order) as Step spans and
        their tensor [Σ count, F] (None when there is none); runs above `MAX_SPAN` rows are
        split into several spans."""
        spans: list[FeatureSpan] = []
        parts: list[torch.Tensor] = []
        for rid in rids:
            held = self.spans.pop(rid, None)
            if held is None:
                continue
            start, feats = held
            for lo in range(0, feats.shape[0], MAX_SPAN):
                part = feats[lo : lo + MAX_SPAN]
                spans.append(FeatureSpan(rid=rid, start=start + lo, count=part.shape[0]))
                parts.append(part)
        if not parts:
            return [], None
        return spans, torch.cat(parts).contiguous()


def extend_features(
    hidden: torch.Tensor, prefix_lens: Sequence[int], extend_lens: Sequence[int]
) -> list[tuple[int, torch.Tensor]]:
    """Each request's (first position, features) of one prefill batch.

    Args:
        hidden: the forward's captured features, [Σ extend_lens, F] (requests in batch order,
            each its extend positions in order: SGLang's FULL capture of an extend batch).
        prefix_lens: per request, the positions already in the KV cache (earlier chunks).
        extend_lens: per request, the positions this forward computed.

    Raises:
        ValueError: `hidden` has another number of rows than the extend positions.
    """
    total = sum(extend_lens)
    if hidden.shape[0] != total:
        raise ValueError(f"features of {hidden.shape[0]} positions, the batch extends {total}")
    out, at = [], 0
    for prefix, n in zip(prefix_lens, extend_lens, strict=True):
        out.append((int(prefix), hidden[at : at + n]))
        at += n
    return out


def verify_features(
    hidden: torch.Tensor, seq_lens: Sequence[int], accept_lens: Sequence[int], width: int
) -> list[tuple[int, torch.Tensor]]:
    """Each request's (first position, features) of its committed positions in one verify
    round: the root at `seq_lens[b]` and the k accepted draft tokens after it.

    Args:
        hidden: the verify forward's features, [B × width, F] (request b's rows b·width ..
            b·width + width − 1 are its root and draft positions).
        seq_lens: per request, its KV length before the round (the root's position).
        accept_lens: per request, k (draft tokens accepted; 0 in a plain round).
        width: positions per request in the forward (γ + 1; 1 in a plain round).

    Raises:
        ValueError: `hidden` does not hold B × width rows, or a k above width − 1.
    """
    if hidden.shape[0] != len(seq_lens) * width:
        raise ValueError(f"features of {hidden.shape[0]} rows, expected {len(seq_lens)}×{width}")
    out = []
    for b, (pos, k) in enumerate(zip(seq_lens, accept_lens, strict=True)):
        if not 0 <= k < width:
            raise ValueError(f"accept length {k} outside 0 .. {width - 1}")
        out.append((int(pos), hidden[b * width : b * width + k + 1]))
    return out
