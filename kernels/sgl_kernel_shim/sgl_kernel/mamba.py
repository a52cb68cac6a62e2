"""`sgl_kernel.mamba`: imported at module level by SGLang's linear-attention backends on CPU
(layers/attention/linear/); none of its ops has a pure-torch implementation, so every public
name raises when called."""

from collections.abc import Callable
from typing import NoReturn

from sgl_kernel._missing import missing_attr


def __getattr__(name: str) -> Callable[..., NoReturn]:
    return missing_attr(__name__, name)
