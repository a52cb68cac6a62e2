"""SSD rounds without SGLang for the GPU checks: a tiny random Qwen2 pair, the speculator engine
and `saguaro.verify`, on one device.

`make_pair` writes a draft and a target (the draft's weights plus noise, so acceptance is
neither 0 nor 1) as HF folders; `Round` drives one request set through rounds: the target scores
the outstanding drafts with a plain full-sequence HF forward (no KV cache), `verify` (with given
uniforms) decides the outcomes, the engine applies them (a cache hit or a just-in-time draft)
and pre-speculates the next round. Imports only torch, transformers and sglang_ssd's saguaro,
speculator and config modules (tests/test_gpu_collection.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import SamplingBatch, VerifyResult, VerifyUniforms, verify
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

VOCAB = 128
LOOKAHEAD = 4
SHARPNESS = 8.0
PROMPTS = [[40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34], [3, 1, 4, 1, 5, 9, 2, 6]]


def make_pair(
    root: Path, seed: int = 0, dtype: torch.dtype = torch.float32, head_dim: int = 16
) -> tuple[Path, Path]:
    """Write (draft, target) folders under `root`: 2-layer Qwen2s, V = 128, 4 query and 2 KV
    heads of `head_dim` (16: float32 shapes for exact CPU/CUDA comparison; 64 or 128 in bf16:
    shapes SGLang's CUDA backends and FlashInfer take), weights saved in `dtype`; the target
    is the draft plus Gaussian noise (0.3 of each tensor's std). The (untied) LM head is scaled
    by `SHARPNESS` so next-token distributions are peaked and greedy top-2 margins far above
    rounding, without the tied-embedding habit of repeating the last token."""
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=4 * head_dim,
        intermediate_size=8 * head_dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * 2,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(SHARPNESS)
    draft, target = root / "draft", root / "target"
    model.to(dtype).save_pretrained(draft)
    model.float()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=gen))
    model.to(dtype).save_pretrained(target)
    return draft, target


def engine_on(
    draft: Path, device: torch.device | str, dtype: torch.dtype = torch.float32, **config: object
) -> SpeculatorEngine:
    """A speculator engine over `draft` on `device` (`dtype`, 4096 KV slots, γ = 4, B = 6)."""
    model = DraftModel.load(draft, device=device, dtype=dtype, num_slots=4096)
    settings = {"lookahead": LOOKAHEAD, "fanout_budget": 6, **config}
    return SpeculatorEngine(model, SSDConfig(**settings), seed=0)  # type: ignore[arg-type]


def target_on(
    target: Path, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """The target as a plain HF model on `device` in `dtype`, eager attention."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    return model.to(device).eval()


@torch.inference_mode()
def target_logits(model: torch.nn.Module, sequence: list[int], depth: int) -> torch.Tensor:
    """float32 [1, D + 1, V]: the target's logits at the root and the D draft positions of
    `sequence` = committed + D draft tokens (one full forward, no cache)."""
    device = next(model.parameters()).device
    ids = torch.tensor([sequence], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return logits[:, len(sequence) - depth - 1 :].float()


@dataclass(frozen=True)
class Record:
    """One verified round: what `verify` read and returned (to replay it on another device).

    Attributes:
        sequences: per request, committed + the D verified draft tokens.
        tokens: int64 [B, D]; q: float32 [B, D, V] (zeros on point-mass rows); point_mass:
            bool [B]; all on the CPU. uniforms: the CPU-drawn `VerifyUniforms`. result: the
            `VerifyResult` on the round's device.
    """

    sequences: list[list[int]]
    tokens: torch.Tensor
    q: torch.Tensor
    point_mass: torch.Tensor
    uniforms: VerifyUniforms
    result: VerifyResult


@dataclass
class Round:
    """Rounds of one request batch: rid i has prompt `PROMPTS[i]` and `temperatures[i]`.

    Attributes:
        engine, target: on the same device.
        emitted: per rid, the tokens emitted so far. sources: per round, the draft sources.
        records: per round, the `Record` of its verify.
    """

    engine: SpeculatorEngine
    target: torch.nn.Module
    temperatures: list[float]
    emitted: dict[str, list[int]] = field(default_factory=dict)
    sources: list[list[str]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    @property
    def rids(self) -> list[str]:
        return [f"r{i}" for i in range(len(self.temperatures))]

    @property
    def sampling(self) -> SamplingBatch:
        """Greedy rows (temperature 0) as SGLang stores them: top_k = 1."""
        top_k = [1 if t == 0.0 else -1 for t in self.temperatures]
        return SamplingBatch.from_lists(self.temperatures, top_k)

    def open(self) -> None:
        """Open every request, draft its first round just in time and pre-speculate the next."""
        for rid, prompt, t in zip(self.rids, PROMPTS * 8, self.temperatures, strict=False):
            top_k = 1 if t == 0.0 else -1
            self.engine.open(rid, prompt, temperature=t, top_k=top_k, top_p=1.0)
            self.emitted[rid] = []
        self.advance([])

    def verify_round(self, uniforms_gen: torch.Generator) -> list[OutcomeIn]:
        """Score the outstanding drafts with the target and verify them with uniforms drawn on
        the CPU from `uniforms_gen`; records the round and returns the outcomes."""
        drafts = [self.engine.requests[r].draft for r in self.rids]
        assert all(d is not None for d in drafts), "a request has no outstanding draft"
        depth = min(d.depth for d in drafts)
        device = self.engine.model.device
        states = [self.engine.requests[r] for r in self.rids]
        sequences = [s.committed + d.tokens[:depth] for s, d in zip(states, drafts, strict=True)]
        logits = torch.cat([target_logits(self.target, seq, depth) for seq in sequences])
        tokens = torch.tensor([d.tokens[:depth] for d in drafts], device=device)
        q = torch.zeros(len(drafts), depth, VOCAB, device=device)
        point_mass = torch.tensor([d.q is None for d in drafts], device=device)
        for i, d in enumerate(drafts):
            if d.q is not None:
                q[i] = d.q[:depth].to(device)
        uniforms = VerifyUniforms.draw(len(drafts), depth, uniforms_gen)
        sampling = self.sampling.to(device)
        result = verify(logits, tokens, q, sampling, point_mass, uniforms=uniforms)
        self.records.append(
            Record(sequences, tokens.cpu(), q.cpu(), point_mass.cpu(), uniforms, result)
        )
        self.sources.append([d.source for d in drafts])
        outcomes = []
        for i, rid in enumerate(self.rids):
            k, bonus = int(result.accept_len[i]), int(result.bonus_token[i])
            self.emitted[rid] += [*drafts[i].tokens[:k], bonus]
            outcomes.append(OutcomeIn(rid, k, bonus))
        return outcomes

    def advance(self, outcomes: list[OutcomeIn]) -> None:
        """Apply `outcomes` (a hit or a miss each), draft the misses just in time, build."""
        failed = self.engine.apply_outcomes(outcomes)
        assert not failed, f"outcomes not applied: {failed}"
        self.engine.serve(self.rids, backup="jit", depth=LOOKAHEAD)
        self.engine.build(self.rids)

    def step(self, uniforms_gen: torch.Generator) -> None:
        """One whole round: verify, then advance."""
        self.advance(self.verify_round(uniforms_gen))
