"""Stand-ins for `sgl_kernel` names without a pure-torch implementation.

SGLang imports many `sgl_kernel` names at module level on code paths a dense model on CPU never
runs. Resolving any public name to a stub keeps those imports working; calling the stub raises,
so nothing unimplemented is ever silently skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

logger = logging.getLogger("sgl_kernel")

_stubs: dict[str, Callable[..., NoReturn]] = {}


def missing_attr(module: str, name: str) -> Callable[..., NoReturn]:
    """Module `__getattr__` body: a stub for public `name` of `module`, AttributeError otherwise.

    Args:
        module: the module's `__name__` (`sgl_kernel` or a submodule).
        name: the attribute looked up.

    Returns:
        A callable that raises NotImplementedError when called.

    Raises:
        AttributeError: `name` is private or dunder (keeps `hasattr` probes such as
            `__version__`-style checks and pickling honest).
    """
    if name.startswith("_"):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    qualified = f"{module}.{name}"
    stub = _stubs.get(qualified)
    if stub is None:

        def stub(*args: Any, **kwargs: Any) -> NoReturn:
            raise NotImplementedError(f"{qualified} has no pure-torch implementation in sglang-ssd")

        stub.__name__ = stub.__qualname__ = name
        stub.__module__ = module
        stub.__doc__ = f"Placeholder: {qualified} is not implemented; calling it raises."
        _stubs[qualified] = stub
        logger.debug("sgl_kernel: %s resolved to a raising placeholder", qualified)
    return stub
