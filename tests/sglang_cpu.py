"""SGLang's own model classes run in this process on the CPU, as references for the EAGLE-3 tests.

SGLang's layers need a distributed world and its model-parallel groups even at TP 1, and its
attention needs a `ForwardBatch` over a KV pool. This sets up a gloo world of one rank and
SGLang's runtime context (as `sglang.test.layer_ut_utils.init_single_process_dist` does, without
importing `sglang.test.test_utils`, which needs the `datasets` package), and builds batches with
SGLang's own attention unit-test kit (`sglang.test.kits.attention_unittest`: its
`MockModelRunner`, its batch builder `_make_forward_batch`, `MHATokenToKVPool`) and the
`torch_native` attention backend. Nothing of SGLang is replaced: the models run their real
`forward`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read at SGLang import (its CPU paths)
MAX_CONTEXT = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def sglang_world() -> Iterator[None]:
    """A gloo world of 1 with SGLang's model-parallel groups (TP = PP = EP = 1), torn down after."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers.rotary_embedding import base as rope

    if not rope._is_cpu:  # SGLang reads SGLANG_USE_CPU_ENGINE once, when first imported
        raise RuntimeError("SGLang was imported before SGLANG_USE_CPU_ENGINE=1 was set")
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    args = ServerArgs(model_path="dummy", tp_size=1, ep_size=1, pp_size=1, device="cpu")
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=ps._WORLD)
    ps.initialize_model_parallel(backend="gloo")
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
        reset_context()


class SGLangCPU:
    """One request's forwards through SGLang models over one KV pool (page size 1).

    Args:
        num_layers / num_kv_heads / head_dim: the KV pool's shape (the model's attention).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

        self._kit = kit
        self._case = self._make_case(0, 1)
        config = kit.TinyModelConfig(
            num_heads=num_kv_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            hidden_size=num_kv_heads * head_dim,
            context_len=MAX_CONTEXT,
        )
        self.runner = kit.MockModelRunner(
            case=self._case,
            model_config=config,
            dtype=torch.float32,
            device="cpu",
            max_context_len=MAX_CONTEXT,
            head_dim=head_dim,
        )
        self.runner.token_to_kv_pool = MHATokenToKVPool(
            size=2 * MAX_CONTEXT,
            page_size=1,
            dtype=torch.float32,
            head_num=num_kv_heads,
            head_dim=head_dim,
            layer_num=num_layers,
            device="cpu",
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        self.backend = kit.ATTENTION_BACKENDS["torch_native"](self.runner)

    def _make_case(self, prefix: int, extend: int | None) -> Any:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        decode = extend is None
        return self._kit.DenseAttentionCase(
            name="eagle3",
            backend="torch_native",
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            num_heads=1,
            num_kv_heads=1,
            page_size=1,
            prefix_lens=(prefix,),
            extend_lens=() if decode else (extend,),
        )

    def run(
        self,
        fn: Callable[[Any], Any],
        input_ids: torch.Tensor,
        prefix: int,
        decode: bool = False,
        spec_hidden: torch.Tensor | None = None,
    ) -> Any:
        """`fn(forward_batch)` for one request of `input_ids` [T] after `prefix` cached tokens.

        A DECODE batch (T = 1, the token at position `prefix`) or an EXTEND batch; the KV of
        positions < prefix is what earlier runs wrote. `spec_hidden` becomes
        `forward_batch.spec_info.hidden_states` (what an EAGLE-3 head reads).
        """
        from types import SimpleNamespace

        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        case = self._make_case(prefix, None if decode else len(input_ids))
        batch = self._kit._make_forward_batch(
            case, self.runner, max_context_len=MAX_CONTEXT, device="cpu"
        )
        batch.input_ids = input_ids
        batch.capture_hidden_mode = CaptureHiddenMode.NULL
        if spec_hidden is not None:
            batch.spec_info = SimpleNamespace(
                hidden_states=spec_hidden, capture_hidden_mode=CaptureHiddenMode.NULL
            )
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata(batch)
            return fn(batch)
