"""One teacher-forced segment: an AR reply and an SSD reply to the same prefix, aligned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eval.sampling import Sampling

TOP = 2


@dataclass(frozen=True)
class Reply:
    """One greedy `/generate` reply with the two most likely tokens at every output position.

    Attributes:
        output_ids: the generated token ids.
        top_ids: per position, the ids of the two most likely tokens (argmax first).
        gaps: per position, top-1 minus top-2 logprob (= the logit gap, logprob is
            log_softmax of the unscaled logits for greedy requests), fp32 as SGLang reports it.
        finish: SGLang's finish_reason type ("length", "stop", ...) or None.
    """

    output_ids: tuple[int, ...]
    top_ids: tuple[tuple[int, int], ...]
    gaps: tuple[float, ...]
    finish: str | None

    @classmethod
    def from_response(cls, out: Mapping[str, Any]) -> Reply:
        """Parse SGLang's `/generate` JSON (`return_logprob`, `top_logprobs_num` 2).

        Raises:
            ValueError: the reply has no top-2 logprobs for every output token.
        """
        ids = tuple(int(t) for t in out.get("output_ids", ()))
        meta = out.get("meta_info", {})
        tops = meta.get("output_top_logprobs") or []
        if len(tops) != len(ids) or any(len(t) < TOP for t in tops):
            raise ValueError(f"{len(ids)} output tokens but top logprobs {tops!r:.200}")
        finish = meta.get("finish_reason")
        return cls(
            output_ids=ids,
            top_ids=tuple((int(t[0][1]), int(t[1][1])) for t in tops),
            gaps=tuple(float(t[0][0]) - float(t[1][0]) for t in tops),
            finish=finish.get("type") if isinstance(finish, Mapping) else finish,
        )


def request_body(input_ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    """The `/generate` body: greedy, top-2 logprobs of the output tokens only."""
    return {
        "input_ids": list(input_ids),
        "sampling_params": Sampling.of(0.0, max_new_tokens=max_new_tokens).to_sglang(),
        "return_logprob": True,
        "top_logprobs_num": TOP,
    }


@dataclass(frozen=True)
class Differing:
    """A position where the decode argmax and the verify argmax differ.

    `index` counts output tokens from the prompt's end (so the context is prompt +
    forced[:index]); gaps in logit units.
    """

    index: int
    decode: int
    verify: int
    decode_gap: float
    verify_gap: float


@dataclass(frozen=True)
class Segment:
    """What one aligned request pair measured, and how the chain goes on.

    Attributes:
        start: output offset of the request's position 0 (tokens forced before it).
        decode_gap, verify_gap: top-2 gaps at positions 1..last (EXTEND's position 0 left
            out), where the two contexts are equal.
        differing: the measured positions whose argmaxes (the emitted greedy tokens) differ;
            at most one, the first divergence.
        tie_orders: measured positions where a reply's top-1 logprob id is not the token it
            emitted (an exact top-2 tie that top-k orders otherwise than argmax).
        appended: tokens the chain's forced sequence grows by (AR's, up to and including the
            first divergence).
        done: the chain cannot go on (AR stopped, or the outputs' lengths disagree).
        reason: why the segment ended ("diverged", "length", "stop", "length-mismatch").
    """

    start: int
    decode_gap: tuple[float, ...]
    verify_gap: tuple[float, ...]
    differing: tuple[Differing, ...]
    tie_orders: int
    appended: tuple[int, ...]
    done: bool
    reason: str

    @property
    def positions(self) -> int:
        return len(self.decode_gap)


def _first_diff(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def align(start: int, ar: Reply, ssd: Reply) -> Segment:
    """Align two replies to the same prefix (teacher-forced up to their first divergence).

    Position k's context is prefix + output[:k]; it is the same on both servers while the
    outputs agree before k, so positions 1..j are measured, j the first differing index (or
    the last common one). Returns the segment; `appended` is AR's output through j.
    """
    n = min(len(ar.output_ids), len(ssd.output_ids))
    j = _first_diff(ar.output_ids, ssd.output_ids)
    last = j if j is not None else n - 1
    measured = range(1, last + 1)
    # The emitted token is the argmax (first index among ties); top-k may order a tie otherwise.
    differing = tuple(
        Differing(start + k, ar.output_ids[k], ssd.output_ids[k], ar.gaps[k], ssd.gaps[k])
        for k in measured
        if ar.output_ids[k] != ssd.output_ids[k]
    )
    tie_orders = sum(r.top_ids[k][0] != r.output_ids[k] for r in (ar, ssd) for k in measured)
    if j is not None:
        # AR stopping at j (its token was EOS or a stop token) ends the chain there.
        done, reason = ar.finish != "length" and j == len(ar.output_ids) - 1, "diverged"
    elif len(ar.output_ids) != len(ssd.output_ids):
        done, reason = True, "length-mismatch"
    else:
        done, reason = ar.finish != "length", ar.finish or "length"
    return Segment(
        start=start,
        decode_gap=tuple(ar.gaps[k] for k in measured),
        verify_gap=tuple(ssd.gaps[k] for k in measured),
        differing=differing,
        tie_orders=tie_orders,
        appended=ar.output_ids[: last + 1],
        done=done,
        reason=reason,
    )
