"""The target captures an EAGLE-3 head's features when the head is SSD's speculator.

SSD presents itself to SGLang like NGRAM, so SGLang's own switch for EAGLE-3 feature capture
(`SpecAuxHiddenStateConfig.eagle_use_aux_hidden_state`, set for `--speculative-algorithm EAGLE3`
only) stays off. This hook turns it on for an SSD server whose `--speculative-draft-model-path`
is an EAGLE-3 head, with the layers the head's config names. SGLang then calls the model's
`set_eagle3_layers_to_capture` itself, in
`ModelRunner.init_attention_backends`, before any CUDA-graph capture, so captured graphs include
the capture. With `CaptureHiddenMode.FULL` (set per forward by `SSDWorker`) the forward's
`logits_output.hidden_states` are then the features: [tokens, num_aux × target hidden], the
captured layers' inputs concatenated in layer order.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_ssd.eagle3.config import head_feature_layers
from sglang_ssd.integration.registration import is_ssd

logger = logging.getLogger(__name__)

HOOK_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.init_spec_aux_hidden_state"


def enable_feature_capture(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER `ModelRunner.init_spec_aux_hidden_state`: on an SSD target (not a draft worker)
    whose draft is an EAGLE-3 head, ask SGLang to capture the head's feature layers."""
    server_args = getattr(runner, "server_args", None)
    if getattr(runner, "is_draft_worker", False) or not is_ssd(
        getattr(server_args, "speculative_algorithm", None)
    ):
        return
    is_head, layers = head_feature_layers(server_args.speculative_draft_model_path)
    if not is_head:
        return
    runner.spec_aux_config.eagle_use_aux_hidden_state = True
    runner.spec_aux_config.eagle_aux_hidden_state_layer_ids = layers
    logger.info(
        "SSD: the target captures the EAGLE-3 head's features (layers %s)",
        "SGLang's default" if layers is None else layers,
    )
