"""The uniforms `verify` draws, given from outside so that two devices can share them.

`verify` draws two sets of uniforms for its sampled rows (docs/design.md#independent-randomness;
Leviathan et al.
2023, Algorithm 1): one per draft token for the acceptance test u < min(1, p(x) / q(x)), and one
per row for the inverse-CDF draw of the bonus token from the residual norm(max(p - q, 0)) (or from
p). CUDA and CPU generators give different streams for one seed, so a CUDA verify cannot be
compared token for token with a CPU one unless both read the same numbers: `VerifyUniforms`
carries them, drawn once (on the CPU, say) and handed to both. With them, the two devices emit
the same tokens except where |u - min(1, p/q)| is within rounding of p (about 1e-6 in float32)
or a bonus uniform lands within rounding of a CDF boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyUniforms:
    """Uniforms in [0, 1) for one `verify` call over B requests with draft length D.

    Attributes:
        accept: float32 or float64 [B, D]; accept[b, j] tests draft token j of row b (accept iff
            accept[b, j] * q(x) < p(x), i.e. with probability min(1, p(x) / q(x))). It is cast to
            the dtype of p (float32, or float64 for float64 logits) before the test, as verify's
            own draws are made in that dtype.
        bonus: float64 [B]; the bonus token of row b is the first index whose float64 CDF of the
            residual (or of p) exceeds bonus[b] times its total.
    Greedy rows ignore theirs. Either tensor may live on any device; verify copies them to the
    logits' device.
    """

    accept: torch.Tensor
    bonus: torch.Tensor

    @classmethod
    def draw(
        cls,
        batch: int,
        depth: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> VerifyUniforms:
        """Draw them as `verify` does for an all-sampled batch: `accept` ([B, D] in `dtype`,
        skipped when D = 0) first, then `bonus` (float64), from `generator` (its device; None:
        the global CPU RNG). So `verify(..., uniforms=VerifyUniforms.draw(B, D, g))` equals
        `verify(..., generator=g')` for g' seeded as g was, when no row is greedy."""
        device = generator.device if generator is not None else torch.device("cpu")
        accept = torch.empty(batch, depth, dtype=dtype, device=device)
        if depth > 0:
            accept = torch.rand(batch, depth, generator=generator, dtype=dtype, device=device)
        bonus = torch.rand(batch, 1, generator=generator, dtype=torch.float64, device=device)
        return cls(accept=accept, bonus=bonus.squeeze(1))

    def select(self, rows: slice | torch.Tensor) -> VerifyUniforms:
        """The uniforms of `rows` (a slice or int64 indices on `accept`'s device or the CPU)."""
        if isinstance(rows, torch.Tensor):
            return VerifyUniforms(
                self.accept[rows.to(self.accept.device)], self.bonus[rows.to(self.bonus.device)]
            )
        return VerifyUniforms(self.accept[rows], self.bonus[rows])

    def check(self, batch: int, depth: int) -> None:
        """Raise ValueError unless accept is float [B, D] and bonus float64 [B]."""
        if not isinstance(self.accept, torch.Tensor) or self.accept.dtype not in (
            torch.float32,
            torch.float64,
        ):
            raise ValueError("uniforms.accept must be a float32/float64 tensor [B, D]")
        if tuple(self.accept.shape) != (batch, depth):
            raise ValueError(
                f"uniforms.accept shape {tuple(self.accept.shape)} != (B, D) = {(batch, depth)}"
            )
        if not isinstance(self.bonus, torch.Tensor) or self.bonus.dtype != torch.float64:
            raise ValueError("uniforms.bonus must be a float64 tensor [B]")
        if tuple(self.bonus.shape) != (batch,):
            raise ValueError(f"uniforms.bonus shape {tuple(self.bonus.shape)} != (B,) = {(batch,)}")
