"""`python -m sglang_ssd.models build eagle3`: train an EAGLE-3 head for the target on this CPU,
reproducibly, and store it in the model cache with a manifest.

Steps (one `--minutes` budget for all; resumable: the work folder keeps the answers generated
and the training checkpoint, so running the same command again continues):

1. Data: local Python sources (`corpus.training_texts`: no evaluation package, no SGLang tests
   or benchmarks, no file sharing 50 characters with an evaluation prompt), tokenized and cut
   into `seq_len`-token sequences, plus the target's own greedy answers to instructions derived
   from those sources (`answers`, `answer_share` of the budget). Held out: the files after the
   training budget give the agreement sequences and the greedy texts that measure accept length.
2. Draft vocabulary: the `draft_vocab` most frequent ids of the training tokens, plus the
   tokenizer's special and EOS ids (`build.vocab.top_ids`), as the head's `d2t`.
3. Training (`train.train`), with the learning curve measured at `milestones` minutes: top-1
   agreement and the greedy accept length at γ = `gamma` (`evaluate`).
4. The head folder (SGLang's format, `load.save_head`, plus the target's tokenizer files) and
   `manifest.json`: data sources with token counts, steps, seed, settings, sha256 of the weights,
   the learning curve and the final accept length.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from sglang_ssd.build import answers as answers_mod
from sglang_ssd.build import corpus, evaluate, train
from sglang_ssd.build.vocab import special_ids, top_ids
from sglang_ssd.config import DEFAULT_LOOKAHEAD
from sglang_ssd.eagle3.features import default_aux_layer_ids
from sglang_ssd.eagle3.load import WEIGHTS_FILE, save_head
from sglang_ssd.speculator.draft_vocab import eos_ids_of

MANIFEST = "manifest.json"
_TOKENIZER_GLOBS = ("tokenizer*", "vocab*", "merges*", "special_tokens_map.json", "*.jinja")


@dataclass(frozen=True)
class BuildSpec:
    """What `build` trains.

    Attributes:
        minutes: the whole budget (answers, training, measurements), > 0.
        seed: one seed for data order, initialisation and training.
        draft_vocab: D, the head's draft vocabulary (0: the full vocabulary, target LM head).
        seq_len: tokens per training sequence.
        corpus_chars: characters of source text read for training.
        heldout_chars: characters of further files held out for measurement.
        answer_share: share of `minutes` spent generating target answers.
        answer_tokens: max new tokens per answer.
        heldout_answers: target-greedy answers held out to measure accept length.
        gamma: γ of the measured accept length.
        aux_layer_ids: target layers feeding the head (None: SGLang's default, written
            explicitly; targets shallower than 4 layers must name them).
        milestones: training minutes at which the learning curve is measured.
        train: the `train.TrainSpec` (its `minutes`, `seed` and `milestones` are set here).
    """

    minutes: float = 90.0
    seed: int = 0
    draft_vocab: int = 16384
    seq_len: int = 256
    corpus_chars: int = 6_000_000
    heldout_chars: int = 60_000
    answer_share: float = 0.15
    answer_tokens: int = 96
    heldout_answers: int = 3
    gamma: int = DEFAULT_LOOKAHEAD
    aux_layer_ids: tuple[int, ...] | None = None
    milestones: tuple[float, ...] = (10.0, 30.0, 90.0)
    train: train.TrainSpec = field(default_factory=train.TrainSpec)

    def __post_init__(self) -> None:
        """Raises ValueError for a setting no build can use (before any model is loaded)."""
        checks = {
            "minutes must be > 0": self.minutes > 0,
            "draft_vocab must be >= 0": self.draft_vocab >= 0,
            "seq_len must be > train.steps_unrolled + 1": (
                self.seq_len > self.train.steps_unrolled + 1
            ),
            "answer_share must be in [0, 1)": 0 <= self.answer_share < 1,
            "gamma must be >= 1": self.gamma >= 1,
            "corpus_chars and heldout_chars must be > 0": min(self.corpus_chars, self.heldout_chars)
            > 0,
        }
        bad = [rule for rule, ok in checks.items() if not ok]
        if bad:
            raise ValueError("; ".join(bad))


def _sequences(tokenizer: Any, texts: Iterable[str], seq_len: int) -> list[torch.Tensor]:
    """Each text tokenized (no special tokens) and cut into `seq_len`-token pieces (a last piece
    shorter than half of `seq_len` is dropped)."""
    out = []
    for text in texts:
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        for start in range(0, ids.numel(), seq_len):
            piece = ids[start : start + seq_len]
            if piece.numel() >= seq_len // 2:
                out.append(piece)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(
    target_dir: str | Path,
    out_dir: str | Path,
    spec: BuildSpec,
    texts: Sequence[tuple[str, str]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train a head for the target at `target_dir` and write it to `out_dir` (see module doc).

    Args:
        target_dir: the target's Hugging Face folder (Qwen2/Llama causal LM with a chat
            template).
        out_dir: the head folder to write; its work folder is `out_dir` + ".work" (kept for
            resume until the head is written, then removed).
        spec: `BuildSpec`.
        texts: (source name, text) pairs to use instead of `corpus.training_texts` (the last
            ~`heldout_chars` of them are held out); for tests on tiny models.
        progress: progress bars (tqdm) with estimates.

    Returns:
        The manifest (also written to `out_dir/manifest.json`).

    Raises:
        ValueError: a budget ≤ 0 or too little text for one sequence.
        sglang_ssd.eval_prompts.EvalPromptsError: the evaluation packages are missing (the
            contamination filter needs them).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    out_dir, work = Path(out_dir), Path(str(out_dir) + ".work")
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    target.requires_grad_(False)
    stats = corpus.CorpusStats()
    if texts is None:
        budget = spec.corpus_chars + spec.heldout_chars
        texts = list(corpus.training_texts(budget, seed=spec.seed, stats=stats))
    train_texts, heldout_texts = _split(texts, spec.heldout_chars)
    sequences = _sequences(tokenizer, [t for _, t in train_texts], spec.seq_len)
    heldout = _sequences(tokenizer, [t for _, t in heldout_texts], spec.seq_len)[:4]
    answer_s = spec.minutes * 60 * spec.answer_share
    prompts = list(answers_mod.instructions(t for _, t in train_texts))
    made = answers_mod.generate_answers(
        target, tokenizer, prompts, work / "answers.jsonl", answer_s, spec.answer_tokens
    )
    held_prompts = list(answers_mod.instructions(t for _, t in heldout_texts))
    greedy = answers_mod.generate_answers(
        target, tokenizer, held_prompts[: spec.heldout_answers], work / "heldout.jsonl",
        float("inf"), spec.answer_tokens,
    )  # fmt: skip
    greedy_texts = [(torch.tensor(r["ids"]), r["prompt_len"]) for r in greedy]
    if not greedy_texts:  # no documented function held out (tiny corpora): raw continuations
        greedy_texts = _continuations(target, heldout[: spec.heldout_answers], spec.answer_tokens)
    sequences += [torch.tensor(r["ids"]) for r in made]
    if not sequences:
        raise ValueError("no training sequence: too little text")
    aux = spec.aux_layer_ids or tuple(default_aux_layer_ids(target.config.num_hidden_layers))
    draft_ids = None
    if spec.draft_vocab:
        counts = torch.zeros(target.config.vocab_size, dtype=torch.int64)
        for s in sequences:
            counts += torch.bincount(s, minlength=counts.numel())
        keep = special_ids(tokenizer, eos_ids_of(target.config))
        draft_ids = top_ids(counts, min(spec.draft_vocab, counts.numel()), keep)
    head = train.new_head(target, draft_ids, aux, seed=spec.seed)

    def measure(_minutes: float, h: Any) -> dict[str, float]:
        h.eval()
        return {
            "top1_agreement": evaluate.top1_agreement(h, target, heldout, aux),
            "accept_length": evaluate.greedy_accept_length(
                h, target, greedy_texts, aux, spec.gamma
            ),
        }

    measuring = time.perf_counter()
    untrained = measure(0.0, head)
    measure_min = (time.perf_counter() - measuring) / 60
    # What is left, less the measurements still to come (each milestone and the final one,
    # timed by the one above) and 2% for writing.
    left = spec.minutes - (time.perf_counter() - started) / 60 - 0.02 * spec.minutes
    due = [m for m in spec.milestones if m < left]
    train_minutes = left - measure_min * (1 + len(due))
    tspec = replace(
        spec.train, minutes=max(train_minutes, 0.05), seed=spec.seed,
        milestones=tuple(m for m in due if m < train_minutes),
    )  # fmt: skip
    state = train.train(head, target, sequences, tspec, work, measure, progress)
    final = measure(tspec.minutes, head)
    save_head(out_dir, head)
    for pattern in _TOKENIZER_GLOBS:
        for f in Path(target_dir).glob(pattern):
            shutil.copy2(f, out_dir / f.name)
    manifest = {
        "target": str(target_dir),
        "seed": spec.seed,
        "spec": _jsonable(asdict(spec)),
        "data": {
            "corpus": {
                "files": len(train_texts),
                "chars": sum(len(t) for _, t in train_texts),
                "sequences": len(sequences) - len(made),
                "tokens": sum(s.numel() for s in sequences) - sum(len(r["ids"]) for r in made),
                "dropped_for_eval_overlap": stats.dropped_overlap,
            },
            "target_answers": {
                "count": len(made),
                "tokens": sum(len(r["ids"]) for r in made),
                "answer_tokens": sum(len(r["ids"]) - r["prompt_len"] for r in made),
            },
            "heldout": {
                "files": len(heldout_texts),
                "sequences": len(heldout),
                "greedy_answers": len(greedy_texts),
            },
        },
        "draft_vocab_size": None if draft_ids is None else int(draft_ids.numel()),
        "aux_layer_ids": list(aux),
        "steps": state.step,
        "training_tokens": state.tokens,
        "training_minutes": state.seconds / 60,
        "untrained": untrained,
        "final": final,
        "learning_curve": [r for r in state.history if "milestone_minutes" in r],
        "history": state.history,
        "weights_sha256": _sha256(out_dir / WEIGHTS_FILE),
        "wall_minutes": (time.perf_counter() - started) / 60,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(work)  # the checkpoint with its optimizer state is ~2x the head
    return manifest


@torch.no_grad()
def _continuations(
    target: torch.nn.Module, sequences: Sequence[torch.Tensor], new_tokens: int
) -> list[tuple[torch.Tensor, int]]:
    """(prefix + the target's greedy continuation, prefix length) for the first half of each
    sequence."""
    out = []
    for s in sequences:
        prefix = s[: max(s.numel() // 2, 1)][None]
        ids = target.generate(prefix, max_new_tokens=new_tokens, do_sample=False)[0]
        out.append((ids, prefix.shape[1]))
    return out


def _split(
    texts: Sequence[tuple[str, str]], heldout_chars: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training, held out): whole texts from the end are held out until `heldout_chars`."""
    held: list[tuple[str, str]] = []
    chars = 0
    rest = list(texts)
    while rest and chars < heldout_chars and len(rest) > 1:
        held.insert(0, rest.pop())
        chars += len(held[0][1])
    return rest, held


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
