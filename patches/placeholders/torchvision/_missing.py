"""Import-only stand-in for torchvision on CPU machines (see patches/README.md).

SGLang imports torchvision at module level from multimodal configs and processors that a text-only
Qwen2 server never calls. PyPI's torchvision cannot sit beside the CPU build of torch, so this
package lets those imports succeed; any real use raises ImportError with the reason.
It has no dist-info, so `transformers.utils.is_torchvision_available()` stays False.
"""

from __future__ import annotations

from typing import Any

_REASON = (
    "torchvision is not installed: sglang-ssd placed an import-only placeholder because PyPI's "
    "torchvision does not work beside the CPU build of torch. Multimodal models are unsupported."
)


class Missing:
    """A name from torchvision: attribute access yields more names, any call raises ImportError."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{self._name}: {_REASON}")

    def __repr__(self) -> str:
        return f"<torchvision placeholder {self._name}>"


def module_getattr(module_name: str):  # noqa: ANN201 - returns a module-level __getattr__
    """Build a PEP 562 module `__getattr__` that hands out `Missing` names for `module_name`."""

    def __getattr__(attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{module_name}.{attr}")

    return __getattr__
