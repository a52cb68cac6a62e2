"""Train an EAGLE-3 head for a transformers target on CPU: a new head, the training loop with a
time budget, checkpoints and resume.

Recipe (EAGLE-3, Li et al. 2025): the head reads the target's fused low/mid/high features
(`features.capture_layers`), is trained with the training-time test unrolled `steps` draft steps
(`ttt.unrolled_loss`), and drafts from a reduced vocabulary of the most frequent token ids
(`d2t`). The target runs once per batch without gradients (`target_pass.target_pass`).

Initialisation: the decoder layer and `fc` from N(0, 0.02) (transformers' Llama default);
`lm_head` from the target's LM-head rows of the kept ids, since the head's hidden is trained to
play the target's final hidden (so a step-0 head starts near "predict what the target's last
layer says"). Every RNG is seeded: one seed gives one head.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_ssd.build.target_pass import target_pass
from sglang_ssd.build.ttt import unrolled_loss
from sglang_ssd.eagle3.config import Eagle3Config
from sglang_ssd.eagle3.features import capture_layers
from sglang_ssd.eagle3.head import Eagle3Head

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainSpec:
    """Training settings.

    Attributes:
        minutes: wall-clock budget of training (resumed runs count earlier time), > 0.
        max_steps: stop after this many optimizer steps (None: the budget alone).
        steps_unrolled: K, training-time-test draft steps.
        lr: AdamW peak learning rate (linear warm-up over `warmup` steps, then constant).
        warmup: warm-up steps.
        weight_decay: AdamW weight decay.
        clip: gradient-norm clip.
        seed: seeds initialisation and the sequence order.
        checkpoint_minutes: minutes between checkpoints (and one at the end).
        milestones: minutes of training after which `on_milestone` is called (learning curve).
        feature_cache_mb: MiB of the target's (features, logits) kept per visited sequence, so
            that a corpus that fits runs the target once per sequence rather than once per step
            (the target is frozen and deterministic: the same tensors either way). A real
            target's float32 logits (V = 151,936: 0.6 MB a token) fill it within ~430 tokens.
    """

    minutes: float = 90.0
    max_steps: int | None = None
    steps_unrolled: int = 3
    lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.0
    clip: float = 0.5
    seed: int = 0
    checkpoint_minutes: float = 5.0
    milestones: tuple[float, ...] = ()
    feature_cache_mb: float = 256.0


@dataclass
class TrainState:
    """What a checkpoint holds besides weights: progress and the learning curve.

    Attributes:
        step: optimizer steps taken.
        cursor: sequences consumed (the order is a seeded permutation, repeated).
        seconds: training seconds spent (milestone measurements not counted).
        tokens: tokens trained on.
        history: one record per 10 steps (losses, agreement per unrolled step) and per
            milestone (with `on_milestone`'s numbers).
        milestones_done: the milestones (minutes) already measured.
    """

    step: int = 0
    cursor: int = 0
    seconds: float = 0.0
    tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    milestones_done: list[float] = field(default_factory=list)


def new_head(
    target: torch.nn.Module,
    draft_ids: torch.Tensor | None,
    aux_layer_ids: Sequence[int],
    seed: int = 0,
) -> Eagle3Head:
    """A fresh head shaped after `target` (a transformers Qwen2/Llama causal LM), float32.

    Args:
        target: the target; its embeddings are attached (and its LM head for a full vocabulary).
        draft_ids: int64 [D] sorted target ids the head drafts from (None: the full vocabulary
            through the target's LM head, SGLang's `draft_vocab_size` null).
        aux_layer_ids: the target layers whose outputs feed the head (written explicitly).
        seed: initialisation seed.

    Raises:
        ValueError: `draft_ids` not sorted, not unique, or outside the vocabulary; aux layers
            the target lacks, none, or a head SGLang would load differently
            (`Eagle3Config.from_dict`'s rules, e.g. a feature width equal to H).
    """
    tc = target.config
    if not aux_layer_ids:
        raise ValueError("aux_layer_ids: name at least one target layer")
    vocab = int(tc.vocab_size)
    if draft_ids is not None and (
        draft_ids.numel() == 0
        or bool((draft_ids[1:] <= draft_ids[:-1]).any())
        or int(draft_ids[0]) < 0
        or int(draft_ids[-1]) >= vocab
    ):
        raise ValueError("draft_ids must be sorted, unique target ids in [0, vocab_size)")
    heads = int(tc.num_attention_heads)
    rope = dict(getattr(tc, "rope_parameters", None) or {})
    rope = rope or {"rope_type": "default", "rope_theta": float(getattr(tc, "rope_theta", 1e4))}
    config = Eagle3Config(
        hidden_size=int(tc.hidden_size),
        num_attention_heads=heads,
        num_key_value_heads=int(tc.num_key_value_heads),
        head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // heads),
        intermediate_size=int(tc.intermediate_size),
        rms_norm_eps=float(tc.rms_norm_eps),
        rope_parameters=rope,
        max_position_embeddings=int(tc.max_position_embeddings),
        vocab_size=vocab,
        draft_vocab_size=None if draft_ids is None else int(draft_ids.numel()),
        target_hidden_size=int(tc.hidden_size),
        aux_layer_ids=tuple(int(i) for i in aux_layer_ids),
        num_aux_hidden_states=len(aux_layer_ids),
    )
    capture_layers(int(tc.num_hidden_layers), config.aux_layer_ids)  # layers the target has
    Eagle3Config.from_dict(config.to_dict())  # every rule a head folder is loaded under
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = Eagle3Head(config)
        for module in head.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=0.02)
    lm_head = target.get_output_embeddings().weight.detach().float()
    if head.lm_head is not None and draft_ids is not None:
        head.lm_head.weight.data.copy_(lm_head[draft_ids])
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
    embed = target.get_input_embeddings().weight.detach().float()
    head.attach_target(embed, lm_head if head.lm_head is None else None)
    return head


def _lr_at(spec: TrainSpec, step: int) -> float:
    return spec.lr * min(1.0, (step + 1) / max(spec.warmup, 1))


def _save(
    workdir: Path, head: Eagle3Head, opt: torch.optim.Optimizer, state: TrainState, state_key: str
) -> None:
    tmp = workdir / (CHECKPOINT + ".tmp")
    torch.save(
        {
            "head": head.state_dict(),
            "opt": opt.state_dict(),
            "state": asdict(state),
            "config": head.config.to_dict(),
            "sequences": state_key,
        },
        tmp,
    )
    tmp.replace(workdir / CHECKPOINT)


def train(
    head: Eagle3Head,
    target: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    spec: TrainSpec,
    workdir: str | Path,
    on_milestone: Callable[[float, Eagle3Head], dict[str, float]] | None = None,
    progress: bool = True,
) -> TrainState:
    """Train `head` in place on `sequences` (int64 [T] each, T > K) until the budget ends.

    Resumes from `workdir/checkpoint.pt` when present (same head shape, same sequences): the
    weights, optimizer, sequence cursor, time spent and learning curve continue from there.

    Args:
        head: from `new_head` (target attached).
        target: the transformers target (eval mode, frozen).
        sequences: training sequences, visited in a `spec.seed` permutation, repeated.
        spec: `TrainSpec`.
        workdir: checkpoint folder (created).
        on_milestone: called with (minutes, head) at each `spec.milestones` entry reached; the
            returned numbers go into that milestone's history record.
        progress: show a tqdm bar over the time budget (with its estimate).

    Returns:
        The final `TrainState` (history: one record per 10 steps and per milestone).

    Raises:
        ValueError: no sequence, or one no longer than K.
    """
    if not sequences or min(s.numel() for s in sequences) <= spec.steps_unrolled:
        raise ValueError(f"need sequences longer than {spec.steps_unrolled} tokens")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    state = TrainState()
    key = _sequences_key(sequences, spec.seed)
    if (workdir / CHECKPOINT).exists():
        saved = torch.load(workdir / CHECKPOINT, weights_only=False)
        if saved.get("config") != head.config.to_dict() or saved.get("sequences") != key:
            raise ValueError(
                f"{workdir / CHECKPOINT} was written for another head or other sequences "
                "(shape, vocabulary, layers, data or seed differ): remove the folder to start "
                "over (`build eagle3 --force` does)"
            )
        head.load_state_dict(saved["head"])  # the target buffers are not persistent
        opt.load_state_dict(saved["opt"])
        state = TrainState(**saved["state"])
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(spec.seed))
    aux = head.config.aux_layer_ids
    budget_s = spec.minutes * 60
    bar = tqdm(
        total=round(budget_s), initial=min(round(state.seconds), round(budget_s)),
        unit="s", desc="train eagle3", disable=not progress,
    )  # fmt: skip
    last_checkpoint = state.seconds
    passes = _PassCache(spec.feature_cache_mb)
    head.train()
    while state.seconds < budget_s and (spec.max_steps is None or state.step < spec.max_steps):
        started = time.perf_counter()
        index = int(order[state.cursor % len(sequences)])
        ids = sequences[index][None]
        features, logits = passes.get(index) or target_pass(target, ids, aux)
        passes.keep(index, features, logits)
        result = unrolled_loss(head, ids, features.float(), logits, spec.steps_unrolled)
        for group in opt.param_groups:
            group["lr"] = _lr_at(spec, state.step)
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, spec.clip)
        opt.step()
        state.step += 1
        state.cursor += 1
        state.tokens += ids.numel()
        spent = time.perf_counter() - started
        state.seconds += spent
        bar.update(min(round(state.seconds) - bar.n, max(round(budget_s) - bar.n, 0)))
        bar.set_postfix(step=state.step, loss=f"{result.loss.item():.3f}")
        if state.step % 10 == 0:
            state.history.append(_record(state, result.step_losses, result.step_agreement))
        for minute in spec.milestones:
            if minute not in state.milestones_done and state.seconds >= minute * 60:
                extra = on_milestone(minute, head) if on_milestone is not None else {}
                head.train()
                state.history.append({"milestone_minutes": minute, **_rec_base(state), **extra})
                state.milestones_done.append(minute)
        if state.seconds - last_checkpoint >= spec.checkpoint_minutes * 60:
            _save(workdir, head, opt, state, key)
            last_checkpoint = state.seconds
    bar.close()
    head.eval()
    _save(workdir, head, opt, state, key)
    return state


class _PassCache:
    """The target's (features, logits) by sequence index, up to `mb` MiB in all."""

    def __init__(self, mb: float) -> None:
        self.room = int(mb * 2**20)
        self.passes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.passes.get(index)

    def keep(self, index: int, features: torch.Tensor, logits: torch.Tensor) -> None:
        size = features.nbytes + logits.nbytes
        if index not in self.passes and size <= self.room:
            self.passes[index] = (features, logits)
            self.room -= size


def _sequences_key(sequences: Sequence[torch.Tensor], seed: int) -> str:
    """sha256 of the sequences and the order's seed: a checkpoint resumes only on the same."""
    digest = hashlib.sha256(str(seed).encode())
    for s in sequences:
        digest.update(s.to(torch.int64).numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def _rec_base(state: TrainState) -> dict[str, float]:
    return {"step": state.step, "minutes": state.seconds / 60, "tokens": state.tokens}


def _record(state: TrainState, losses: torch.Tensor, agreement: torch.Tensor) -> dict[str, float]:
    out = _rec_base(state)
    for j, (loss, agree) in enumerate(zip(losses.tolist(), agreement.tolist(), strict=True)):
        out[f"loss_{j}"] = loss if math.isfinite(loss) else float("nan")
        out[f"agreement_{j}"] = agree
    return out


def write_history(path: str | Path, state: TrainState) -> None:
    """The learning curve as JSON (one record per 10 steps and per milestone)."""
    Path(path).write_text(json.dumps(state.history, indent=1) + "\n")
