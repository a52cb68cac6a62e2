"""End to end on CPU: SGLang servers on a tiny random Qwen2 pair, greedy output vs torch_native.

Runs `python -m sglang.launch_server --device cpu` for plain decoding with the `torch_native`
and `intel_amx` attention backends (the latter on sglang-ssd's pure-torch `sgl_kernel` ops) and
for SGLang's STANDALONE (chain and tree) and NGRAM speculative decoding, which on CPU exist only
with `intel_amx`. Greedy outputs must be identical token for token to `torch_native`'s, and
the speculative servers must really have verified drafts.

The models are float32: a random tiny model has top-2 logit margins down to ~1e-2, which bf16
rounding differences between attention kernels (verify vs decode shapes) do flip; float32 noise
(~1e-6) does not. One server runs at a time (about 20 s to start on 2 cores).

Marked `real` (`make test-real`): five server starts with SGLang's own launcher cost about 8
minutes of CI's budget. CI checks the same CPU path with the session's shared tiny AR server
against transformers (`test_sglang_cpu_path.py`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

MAX_NEW_TOKENS = 16
# Prompts as token ids of the character-level tokenizer below ("def fibonacci(n):", ...), so the
# comparison does not depend on how SGLang and transformers pre-tokenise text.
PROMPTS = [
    [68, 69, 70, 0, 70, 73, 66, 79, 78, 65, 67, 67, 73, 8, 78, 9, 26],
    [52, 72, 69, 0, 81, 85, 73, 67, 75, 0, 66, 82, 79, 87, 78, 0, 70, 79, 88],
    [51, 37, 44, 37, 35, 52, 0, 10, 0, 38, 50, 47, 45, 0, 85, 83, 69, 82, 83],
]
AMX = ["--attention-backend", "intel_amx"]
CONFIGS: dict[str, list[str]] = {
    "torch_native": ["--attention-backend", "torch_native"],
    "intel_amx": AMX,
    "standalone": [
        *AMX,
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        "{draft}",
        "--speculative-num-steps",
        "4",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "5",
    ],
    "standalone_tree": [
        *AMX,
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        "{draft}",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "2",
        "--speculative-num-draft-tokens",
        "6",
    ],
    "ngram": [*AMX, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"],
}
SPECULATIVE = ["standalone", "standalone_tree", "ngram"]
START_TIMEOUT_S = 300
pytestmark = pytest.mark.real


def build_tiny_pair(root: Path) -> tuple[Path, Path]:
    """A 2-layer random Qwen2 target and a 1-layer draft made of the target's first layer.

    The target's second layer writes scaled-down residuals, so the draft agrees with it often
    but not always: verify sees both accepted and rejected drafts.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    vocab = {chr(i): i - 32 for i in range(32, 127)}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    shape = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=len(vocab) - 1,
        bos_token_id=len(vocab) - 1,
        initializer_range=0.2,
    )
    target = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, **shape))
    draft = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=1, **shape))
    with torch.no_grad():
        second = target.model.layers[1]
        second.self_attn.o_proj.weight.mul_(0.3)
        second.mlp.down_proj.weight.mul_(0.3)
    draft.load_state_dict(
        {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    )
    paths = root / "target", root / "draft"
    for model, path in zip((target, draft), paths, strict=True):
        model.save_pretrained(path)
        fast.save_pretrained(path)
    return paths


class Server:
    """`python -m sglang.launch_server` in its own process group, killed as a group on exit."""

    def __init__(self, model: Path, args: list[str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        self.cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-total-tokens",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--skip-server-warmup",
            *args,
        ]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=log.parent,
            )

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log_tail()}")

    def generate(self, input_ids: list[int]) -> dict[str, Any]:
        body = {
            "input_ids": input_ids,
            "sampling_params": {
                "max_new_tokens": MAX_NEW_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
            },
        }
        request = urllib.request.Request(
            f"{self.url}/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        """SIGTERM the group (SGLang shuts its children down), then SIGKILL any straggler."""
        for sig, grace_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return  # the whole group is gone
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Per configuration: the `/generate` responses for PROMPTS, one request at a time."""
    root = tmp_path_factory.mktemp("tiny_cpu_serving")
    target, draft = build_tiny_pair(root)
    results = {}
    for name, args in CONFIGS.items():
        server = Server(target, [a.format(draft=draft) for a in args], root / f"{name}.log")
        try:
            server.wait_healthy(START_TIMEOUT_S)
            results[name] = [server.generate(ids) for ids in PROMPTS]
        finally:
            server.stop()
    return results


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "torch_native"])
def test_greedy_output_matches_torch_native(served, name: str) -> None:
    expected = [r["output_ids"] for r in served["torch_native"]]
    got = [r["output_ids"] for r in served[name]]
    assert all(len(ids) == MAX_NEW_TOKENS for ids in expected)
    assert got == expected


@pytest.mark.parametrize("name", SPECULATIVE)
def test_speculative_servers_verify_drafts(served, name: str) -> None:
    metas = [r["meta_info"] for r in served[name]]
    assert all(m["spec_verify_ct"] > 0 for m in metas)
    # fewer verify rounds than tokens somewhere: drafts were accepted, not just bonus tokens
    assert any(m["spec_verify_ct"] < m["completion_tokens"] for m in metas)
