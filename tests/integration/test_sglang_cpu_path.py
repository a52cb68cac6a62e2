"""SGLang's CPU serving path, CI's check: the session's shared tiny AR server reproduces
transformers' greedy output.

That server is SGLang's own scheduler, model runner and sampler on its CPU engine with the
`intel_amx` attention backend over this package's pure-torch `sgl_kernel` ops (our launcher
only adds flags and loads the plugin), so a break anywhere on that path (an op of the shim, the
attention backend, the model's forward, the CPU platform override) changes the tiny target's
greedy tokens. The reference is transformers' fp32 forward of the same folder, token by token.
A divergence is allowed only where the fp32 top-2 margin is below ε
(docs/design.md#the-greedy-rule).

The five-server comparison with SGLang's own launcher (`torch_native` as the reference,
`intel_amx`, STANDALONE chain and tree, NGRAM) is `test_cpu_serving_tiny.py`, in
`make test-real`.
"""

from __future__ import annotations

from pathlib import Path

import requests

from eval.servers import Server
from sglang_ssd.testing.greedy import check_greedy, transformers_greedy
from sglang_ssd.testing.tiny_models import tokenize

PROMPTS = ["def fibonacci(n):", "SELECT * FROM", "the quick brown fox"]
NEW_TOKENS = 24


def _served(server: Server, prompts: list[list[int]]) -> list[list[int]]:
    sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    response = requests.post(
        f"{server.url}/generate",
        json={"input_ids": prompts, "sampling_params": sampling},
        timeout=300,
    )
    response.raise_for_status()
    return [r["output_ids"] for r in response.json()]


def test_tiny_ar_server_matches_transformers_greedy(tiny_ar: Server, tiny_target: Path) -> None:
    prompts = [tokenize(p) for p in PROMPTS]
    expected = transformers_greedy(tiny_target, prompts, [NEW_TOKENS] * len(prompts))
    got = _served(tiny_ar, prompts)
    check = check_greedy(tiny_target, prompts, expected, got)
    assert not check.violations, check.violations
    assert len({tuple(ids) for ids in expected}) == len(prompts)  # varied output, not one loop
