"""Startup check: the draft must share the target's tokenizer.

SSD moves token ids between the target and the speculator, never text, so a draft whose
tokenizer maps any token to another id (or names other special tokens) would draft garbage that
verification merely rejects: correct output, no speedup, and no error anywhere. The check
compares the two tokenizers as transformers loads them: the same id for every token (the full
`get_vocab()`, added tokens included) and the same special tokens with the same ids. The models'
embedding tables may still be padded to different sizes (`vocab_size` in their configs).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

SPECIAL_ROLES = ("bos", "eos", "unk", "pad")
EXAMPLES = 3
# The files a Hugging Face tokenizer is built from (the chat template does not change ids).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


class TokenizerMismatch(ValueError):
    """The draft's tokenizer differs from the target's (or one of them cannot be loaded)."""


def special_token_ids(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's special tokens: each role's id (bos, eos, unk, pad; None when unset)
    and every special token with its id, under "all"."""
    ids: dict[str, Any] = {
        role: getattr(tokenizer, f"{role}_token_id", None) for role in SPECIAL_ROLES
    }
    ids["all"] = sorted(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True))
    return ids


def vocab_differences(target: dict[str, int], draft: dict[str, int]) -> list[str]:
    """How two token → id maps differ, as readable phrases ([] when equal)."""
    if target == draft:
        return []
    moved = sorted(t for t in target.keys() & draft.keys() if target[t] != draft[t])
    only_target = sorted(target.keys() - draft.keys())
    only_draft = sorted(draft.keys() - target.keys())
    found = []
    if moved:
        shown = ", ".join(f"{t!r}: {target[t]} vs {draft[t]}" for t in moved[:EXAMPLES])
        more = ", ..." if len(moved) > EXAMPLES else ""
        found.append(f"{len(moved)} tokens have other ids in the draft ({shown}{more})")
    for side, tokens in (("target", only_target), ("draft", only_draft)):
        if tokens:
            found.append(f"{len(tokens)} tokens only in the {side} (e.g. {tokens[:EXAMPLES]})")
    return found


def same_tokenizer_files(target: str | Path, draft: str | Path) -> bool:
    """Whether two local folders hold byte-identical tokenizer files (at least one), which makes
    them the same tokenizer without loading either (a real pair's 150k-token vocabularies take
    seconds to load and compare)."""
    target, draft = Path(target), Path(draft)
    if not (target.is_dir() and draft.is_dir()):
        return False
    contents = [(_read(target / name), _read(draft / name)) for name in TOKENIZER_FILES]
    return any(t is not None for t, _ in contents) and all(t == d for t, d in contents)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@functools.lru_cache(maxsize=8)
def tokenizer_mismatch(target: str, draft: str, trust_remote_code: bool = False) -> str | None:
    """Why the draft's tokenizer (folder or hub id `draft`) differs from the target's, or None.

    Raises:
        TokenizerMismatch: if either tokenizer cannot be loaded.
    """
    from transformers import AutoTokenizer

    if same_tokenizer_files(target, draft):
        return None
    loaded = {}
    for role, path in (("target", target), ("draft", draft)):
        try:
            loaded[role] = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as exc:  # any loader error, reported with both models named
            raise TokenizerMismatch(
                f"SSD needs the draft to share the target's tokenizer, but the {role}'s "
                f"tokenizer could not be loaded from {path!r} (target {target!r}, draft "
                f"{draft!r}): {exc}"
            ) from exc
    target_tok, draft_tok = loaded["target"], loaded["draft"]
    found = vocab_differences(target_tok.get_vocab(), draft_tok.get_vocab())
    target_special, draft_special = special_token_ids(target_tok), special_token_ids(draft_tok)
    if target_special != draft_special:
        found.append(f"special tokens differ: target {target_special} vs draft {draft_special}")
    return "; ".join(found) or None


def check_shared_tokenizer(target: str, draft: str, trust_remote_code: bool = False) -> None:
    """Refuse a target/draft pair whose tokenizers differ.

    Args:
        target: the target's tokenizer (SGLang's `--tokenizer-path`, default the model path).
        draft: `--speculative-draft-model-path`.
        trust_remote_code: passed to `AutoTokenizer.from_pretrained`.

    Raises:
        TokenizerMismatch: naming both models and what differs (or which could not be loaded).
    """
    reason = tokenizer_mismatch(str(target), str(draft), trust_remote_code)
    if reason is not None:
        raise TokenizerMismatch(
            f"SSD needs the draft to share the target's tokenizer (the same id for every "
            f"token, the same special tokens): target {target!r} and draft {draft!r} differ: "
            f"{reason}"
        )
