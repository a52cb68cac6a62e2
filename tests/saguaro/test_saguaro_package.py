"""`sglang_ssd.saguaro` must import with torch alone (docs/design.md#the-gpu-machine: the GPU box
has no
sglang, pyzmq or msgspec)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sglang_ssd.saguaro


def test_package_imports_with_torch_alone() -> None:
    """No sglang / pyzmq / msgspec (or anything but torch and the stdlib) at import time."""
    allowed = {
        "__future__",
        "collections",
        "dataclasses",
        "enum",
        "importlib",
        "math",
        "typing",
        "torch",
    }
    package = Path(sglang_ssd.saguaro.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert {n.split(".")[0] for n in names} <= allowed, f"{path.name}: {names}"


def test_a_name_spelled_like_its_submodule_stays_the_function() -> None:
    """`verify` is both a function and the submodule defining it: importing the submodule
    through another name first (`VerifyResult`) must not leave the package's `verify` bound to
    the module (a fresh interpreter, since the import order is the point)."""
    code = (
        "from sglang_ssd.saguaro import VerifyResult, verify\n"
        "import sglang_ssd.saguaro as s\n"
        "assert callable(verify) and callable(s.verify), type(verify)\n"
        "assert s.VerifyResult is VerifyResult\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
