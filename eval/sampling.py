"""`Sampling`: one request's sampling settings, for a server request or an offline verify.

The same settings travel two ways: to a server as SGLang's `sampling_params` (`to_sglang`), and
to `sglang_ssd.saguaro.verify` / `SpeculatorEngine.open` in the offline tools (`batch`, and the
`temperature`, `top_k`, `top_p` fields themselves), so greedy means the same thing in both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang_ssd.saguaro.sampling import GREEDY_TEMPERATURE_EPS, SamplingBatch


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters. A temperature below 1e-6 (SGLang's `_SAMPLING_EPS`) or top-k 1 is
    greedy; a seed makes T > 0 repeatable on a server."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # stop strings (SGLang's `stop`)
    options: str = ""  # a JSON object of further SGLang sampling params (penalties, grammars)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1

    @property
    def name(self) -> str:
        """File tag: "greedy" or e.g. "t0.7"."""
        return "greedy" if self.greedy else f"t{self.temperature:g}"

    @classmethod
    def of(cls, temperature: float, **kw: Any) -> Sampling:
        """Greedy (temperature 0, top-k 1) below 1e-6, else the whole vocabulary at
        `temperature`; `kw` sets the other fields."""
        if temperature < GREEDY_TEMPERATURE_EPS:
            return cls(temperature=0.0, top_k=1, **kw)
        return cls(temperature=float(temperature), **kw)

    def verify_params(self) -> dict[str, Any]:
        """The fields the target's p and the draft's q depend on (temperature, top_k, top_p)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def batch(self, size: int = 1) -> SamplingBatch:
        """These settings for `size` requests, as `saguaro.verify` takes them."""
        return SamplingBatch.from_lists(
            [self.temperature] * size, [self.top_k] * size, [self.top_p] * size
        )

    def to_sglang(self, request_index: int = 0) -> dict[str, Any]:
        """SGLang's `sampling_params`; the seed is offset per request so requests differ."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "ignore_eos": self.ignore_eos,
        }
        if self.seed is not None and not self.greedy:
            params["sampling_seed"] = self.seed + request_index
        if self.stop:
            params["stop"] = list(self.stop)
        if self.options:
            params |= json.loads(self.options)
        return params
