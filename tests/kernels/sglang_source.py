"""Reference functions compiled straight from the pinned SGLang's source files.

The CPU ops are tested against SGLang's own Triton kernels (and torch_native attention). Those
are self-contained functions, but importing the SGLang modules that hold them costs 10-25 s on
the 2-core dev machine, so the tests compile just the function out of the installed file (with
its real file name and line numbers, which Triton's interpreter needs to re-read it).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def _interpreter_env() -> Iterator[None]:
    """TRITON_INTERPRET=1 while inside, the previous value restored after.

    Triton reads it when it jits a function (triton.language's own helpers are jitted on first
    import) and in a few places while interpreting. It is never left set: SGLang servers that
    other tests start from this process would inherit it.
    """
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


# Test modules import this file during collection, before anything imports triton.
with _interpreter_env():
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction


def sglang_file(relpath: str) -> Path:
    """Path of `relpath` inside the installed `sglang` package (nothing is imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("sglang is not installed")
    return Path(spec.origin).parent / relpath


def load_function(relpath: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile function (or method) `name` from SGLang's `relpath`, decorators dropped.

    Args:
        relpath: file inside the sglang package, e.g. "kernels/ops/speculative/eagle.py".
        name: function name; the first definition with that name is used.
        namespace: globals the function needs (e.g. `{"tl": triton.language}`).
    """
    path = sglang_file(relpath)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
            scope = dict(namespace)
            exec(code, scope)
            return scope[name]
    raise LookupError(f"{name} not found in {path}")


def triton_reference(relpath: str, name: str) -> Callable[..., Any]:
    """SGLang's Triton kernel `name` from `relpath`, runnable as `kernel[grid](...)` on CPU."""
    if not isinstance(tl.cdiv, InterpretedFunction):
        raise RuntimeError(
            "triton was imported before these tests could switch on its interpreter (another "
            "test module imported it first); run with TRITON_INTERPRET=1 in the environment"
        )
    kernel = InterpretedFunction(load_function(relpath, name, {"tl": tl, "triton": triton}))

    class Launcher:
        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            def launch(*args: Any, **kwargs: Any) -> None:
                with _interpreter_env():
                    kernel[grid](*args, **kwargs)

            return launch

    return Launcher()
