"""The target of the offline tools: a transformers causal LM with a `DynamicCache`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class HFTarget:
    """The target as a transformers causal LM with a `DynamicCache` (one request or a batch).

    The cache holds every committed token except the root (the newest, not yet scored); a verify
    forward appends [root, d_1..d_D] and `rollback` cuts it back to the accepted prefix.
    """

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.cache: Any = None

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor) -> None:
        """Start a new cache holding int64 [b, n] tokens (n may be 0)."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        if tokens.shape[1] > 0:
            self.model(
                input_ids=tokens, past_key_values=self.cache, use_cache=True, logits_to_keep=1
            )

    @torch.inference_mode()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """float32 [b, n, V] logits of int64 [b, n] tokens appended to the cache."""
        out = self.model(input_ids=tokens, past_key_values=self.cache, use_cache=True)
        return out.logits.float()

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions of the cache."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)
