"""`TargetFeatures`: the target's EAGLE-3 features of one request's committed positions.

The target sends features f_p (the aux hidden states of its `layers_to_capture`, n × hidden
wide) for the prompt after its prefill and for the k + 1 committed positions of every verified
round. An EAGLE-3 head's row for the token at
position p + 1 reads fc(f_p) (`head_model`); this buffer holds the features not yet consumed.
"""

from __future__ import annotations

import torch


class TargetFeatures:
    """Features of positions `start` .. `count` − 1 of one request (those below `start` were
    fed and trimmed). Positions arrive in order; a repeat of known positions is ignored."""

    def __init__(self) -> None:
        self.start = 0
        self.buf: torch.Tensor | None = None

    @property
    def count(self) -> int:
        """Positions 0 .. count − 1 have arrived (fed or still buffered)."""
        return self.start + (0 if self.buf is None else self.buf.shape[0])

    def add(self, start: int, feats: torch.Tensor) -> int | None:
        """Append features [n, F] of positions start .. start + n − 1; returns the first position
        that is new (None: nothing new).

        Raises:
            ValueError: a gap (start > `count`) or a width unlike the buffered features'.
        """
        if start > self.count:
            raise ValueError(f"features from position {start}, but only {self.count} arrived")
        new = feats[self.count - start :]
        if new.shape[0] == 0:
            return None
        first = self.count
        if self.buf is not None and new.shape[1:] != self.buf.shape[1:]:
            raise ValueError(f"features of width {new.shape[1:]}, buffered {self.buf.shape[1:]}")
        self.buf = new if self.buf is None else torch.cat([self.buf, new.to(self.buf)])
        return first

    def at(self, start: int, n: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(features [n, F] or None, known bool [n]) of positions start .. start + n − 1;
        rows not buffered are zeros and not known. The features are on the buffer's device
        (the speculator's: CUDA features stay on the GPU), `known` on the CPU."""
        pos = torch.arange(start, start + n)
        known = (pos >= self.start) & (pos < self.count)
        if self.buf is None or not bool(known.any()):
            return None, known
        out = torch.zeros(n, self.buf.shape[1], dtype=self.buf.dtype, device=self.buf.device)
        rows = (pos[known] - self.start).to(self.buf.device)
        out[known.to(self.buf.device)] = self.buf[rows]
        return out, known

    def trim(self, below: int) -> None:
        """Forget the features of positions < `below` (rows fed for good)."""
        drop = min(max(below - self.start, 0), self.count - self.start)
        if drop and self.buf is not None:
            self.buf = self.buf[drop:]
            self.start += drop
