"""`sglang_ssd.saguaro` must import with torch alone (DESIGN.md section 3: the GPU box has no
sglang, pyzmq or msgspec)."""

from __future__ import annotations

import ast
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
