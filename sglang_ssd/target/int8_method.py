"""`--quantization ssd_int8`: the target's linear layers and LM head in int8 on the CPU,
through SGLang's own quantization-method mechanism.

The bf16 checkpoint loads as usual (the layers' weights are created as SGLang's unquantised
method creates them); once it is loaded, SGLang calls each layer's
`process_weights_after_loading`, which turns the bf16 weight into int8 codes and a float32
scale per output row (`int8_kernel.quantize_rows`), or reads both from the cache beside the
checkpoint (`int8_cache`), and packs them for FBGEMM (`int8_kernel.pack_rows`); the bf16 tensor
is freed. A progress bar counts the layers. Forwards then run `int8_kernel.int8_linear`
(activations quantised per row, so a verify row equals the same row decoded alone). With
tensor parallelism each rank quantises and caches its own shard (untested beyond TP 1).

Everything else (embeddings, norms, RoPE, attention, the KV cache) stays in the model's dtype.
The method is registered by the plugin (`register`) in every SGLang process: it joins SGLang's
`QUANTIZATION_METHODS` and the `--quantization` choices (`add_quantization_method_choices`, the
extension point SGLang keeps for plugins), and the loader's `_get_quantization_config` is
wrapped to hand the config the checkpoint's folder for the cache.

Refusals (a `ValueError` at start-up): a device other than the CPU, a torch without a CPU int8
GEMM (FBGEMM; `int8_kernel.kernel_unavailable`). A layer this method does not cover keeps bf16.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from sglang.srt.layers.quantization.base_config import LinearMethodBase, QuantizationConfig
from torch.nn import Parameter

from sglang_ssd.target import METHOD
from sglang_ssd.target.int8_cache import Int8Cache
from sglang_ssd.target.int8_kernel import (
    int8_linear,
    kernel_unavailable,
    pack_rows,
    quantize_rows,
)

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump when the stored codes change: it keys the cache


def _shard() -> str:
    """This process's tensor-parallel shard, e.g. "tp0of1"."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return f"tp{parallel.tp_rank}of{parallel.tp_size}"


class Int8Config(QuantizationConfig):
    """SGLang's quantization config of `--quantization ssd_int8` (online: no checkpoint file).

    Attributes:
        model_path: the checkpoint's folder (set by the wrapped loader), where the cache lives.
        cache_hit: whether the load found its cache file (None before it begins).
        quantized_layers: layers quantised at this load (the others came from the cache).

    Raises:
        ValueError: off the CPU, or without a CPU int8 GEMM in this torch.
    """

    def __init__(self) -> None:
        super().__init__()
        from sglang.srt.utils import is_cpu

        if not is_cpu():
            raise ValueError(
                f"--quantization {METHOD} runs on the CPU only (SGLang's CPU engine, "
                "SGLANG_USE_CPU_ENGINE=1); on a GPU use SGLang's own methods, e.g. fp8"
            )
        reason = kernel_unavailable()
        if reason is not None:
            raise ValueError(f"--quantization {METHOD}: {reason}; serve without it (bf16)")
        self.model_path: str | None = None
        self._layers: list[Int8LinearMethod] = []
        self._done = 0
        self.cache_hit: bool | None = None
        self.quantized_layers = 0
        self._cache: Int8Cache | None = None
        self._progress: Any = None

    def get_name(self) -> str:
        return METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # CPU only; the constructor refuses GPUs

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # online: quantised from the bf16 checkpoint at load

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Int8Config:
        return cls()

    def get_scaled_act_names(self) -> list[str]:
        return []

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Int8LinearMethod | None:
        """Our method for SGLang's linear layers and LM head; None (bf16) for the rest."""
        from sglang.srt.layers.linear import LinearBase
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

        if isinstance(layer, LinearBase | ParallelLMHead):
            return Int8LinearMethod(self, prefix)
        return None

    def _created(self, method: Int8LinearMethod) -> None:
        self._layers.append(method)

    def _begin(self) -> None:
        from tqdm import tqdm

        if self.model_path is not None and Path(self.model_path).is_dir():
            try:
                self._cache = Int8Cache(Path(self.model_path), f"{METHOD}-{VERSION}", _shard())
            except FileNotFoundError as exc:
                logger.warning("int8 target: no cache (%s)", exc)
        hit = self.cache_hit = self._cache is not None and self._cache.hit
        self._progress = tqdm(
            total=len(self._layers),
            desc="int8 target: " + ("loading cached layers" if hit else "quantising layers"),
            unit="layer",
        )

    def _quantized(self, name: str, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes, float32 scales) of layer `name`: from the cache, or quantised now."""
        if self._done == 0:
            self._begin()
        cached = None
        if self._cache is not None:
            q, scale = self._cache.get(f"{name}.qweight"), self._cache.get(f"{name}.scale")
            if q is not None and scale is not None and q.shape == weight.shape:
                cached = (q, scale)
        if cached is None:
            self.quantized_layers += 1
            cached = quantize_rows(weight)
        if self._cache is not None and not self._cache.hit:  # kept for saving at the end
            self._cache.put(f"{name}.qweight", cached[0])
            self._cache.put(f"{name}.scale", cached[1])
        self._done += 1
        self._progress.update()
        if self._done == len(self._layers):
            self._finish()
        return cached

    def _finish(self) -> None:
        self._progress.close()
        if self._cache is not None and not self._cache.hit and self.quantized_layers:
            path = self._cache.save()
            if path is not None:
                logger.info("int8 target: %d layers cached in %s", self._done, path)
        self._cache = None  # frees the codes it held for saving (the packed weights are kept)


class Int8LinearMethod(LinearMethodBase):
    """SGLang linear method of one layer: bf16 weights at load, int8 after it.

    Args:
        config: the model's `Int8Config` (counts layers, holds the cache).
        prefix: the layer's name in the model (the cache's key for it).
    """

    def __init__(self, config: Int8Config, prefix: str) -> None:
        self.config = config
        self.prefix = prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """The bf16 `weight` [sum(output_partition_sizes), input_size_per_partition] that the
        checkpoint loads into, as SGLang's unquantised method makes it."""
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

        UnquantizedLinearMethod().create_weights(
            layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
            params_dtype, **extra_weight_attrs,
        )  # fmt: skip
        self.config._created(self)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Replace `layer.weight` (bf16 [N, K]) by FBGEMM's packed int8 weight
        (`layer.int8_weight`); `layer.weight` stays as an int8 placeholder on the meta device
        (its shape and bytes, no memory), since SGLang's LM-head path asks for one."""
        q, scale = self.config._quantized(self.prefix, layer.weight.data)
        layer.int8_weight = pack_rows(q, scale)
        layer.weight = Parameter(torch.empty(q.shape, dtype=torch.int8, device="meta"),
                                 requires_grad=False)  # fmt: skip

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`x` [..., K] times the int8 weight (`int8_kernel.int8_linear`), in `x.dtype`."""
        return int8_linear(x, layer.int8_weight, bias)


def register() -> None:
    """Make `--quantization ssd_int8` known to SGLang in this process (idempotent): the
    method table, the flag's choices, and the loader's hand-over of the checkpoint folder."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers import quantization
    from sglang.srt.model_loader import loader

    quantization.QUANTIZATION_METHODS.setdefault(METHOD, Int8Config)
    if METHOD not in choices.QUANTIZATION_CHOICES:
        choices.add_quantization_method_choices([METHOD])
    original = loader._get_quantization_config
    if getattr(original, "_ssd_int8", False):
        return

    def with_model_path(model_config: Any, load_config: Any) -> Any:
        config = original(model_config, load_config)
        if isinstance(config, Int8Config):
            config.model_path = model_config.model_path
        return config

    with_model_path._ssd_int8 = True  # type: ignore[attr-defined]
    loader._get_quantization_config = with_model_path
