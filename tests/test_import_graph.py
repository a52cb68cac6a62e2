"""The package's import graph: no cycles, and the layer contracts of docs/design.md#code-layers.

Every import statement counts, including those inside functions (a lazy import that closes a
cycle still ties the modules together) and under `if TYPE_CHECKING:` (an annotation that names
another module's class ties the two as much as a call does). The graph is read with `ast`,
nothing is imported. An edge goes to the module named (`from pkg import
sub` to ``pkg.sub`` when that is a module, else to ``pkg``), as grimp draws it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sglang_ssd": ROOT / "sglang_ssd",
    "sglang_ssd_kernels": ROOT / "kernels" / "sglang_ssd_kernels",
    "eval": ROOT / "eval",  # the benchmarks: no cycles either
}


def module_files() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's ``__init__``)."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            is_init = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return out


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under `node`."""
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child


def _names(node: ast.Import | ast.ImportFrom, module: str, is_init: bool) -> Iterator[str]:
    """Dotted names `node` may import: ``base.name`` candidates first, then ``base``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".")
        package = package if is_init else package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    for alias in node.names:
        yield f"{base}.{alias.name}"
    yield base


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(internal edges, external top-level packages) per module."""
    files = module_files()
    edges: dict[str, set[str]] = {m: set() for m in files}
    external: dict[str, set[str]] = {m: set() for m in files}
    for module, (path, is_init) in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree):
            names = list(_names(node, module, is_init))
            if isinstance(node, ast.ImportFrom):  # `from base import x`: x or else base
                names = [n for n in names[:-1] if n in files] or names[-1:]
            for name in names:
                if name.split(".")[0] not in PACKAGES:
                    external[module].add(name.split(".")[0])
                elif name in files and name != module:
                    edges[module].add(name)
    return edges, external


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_cycle_in(component, edges) for component in components]


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first back to `start` inside the component
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a cycle")


def reachable(edges: dict[str, set[str]], sources: list[str]) -> dict[str, list[str]]:
    """Module -> one import chain to it from `sources`."""
    chains = {s: [s] for s in sources}
    frontier = list(sources)
    while frontier:
        v = frontier.pop()
        for w in sorted(edges[v]):
            if w not in chains:
                chains[w] = [*chains[v], w]
                frontier.append(w)
    return chains


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


GRAPH = import_graph()


def test_the_graph_sees_the_packages() -> None:
    edges, external = GRAPH
    assert "sglang_ssd.worker.ssd_worker" in edges["sglang_ssd.integration.registration"]
    assert "sglang_ssd.worker.speculator_client" in edges["sglang_ssd.worker.ssd_worker"]
    assert "sglang" in external["sglang_ssd.worker.ssd_worker"]
    assert any(_in(m, "sglang_ssd_kernels") for m in edges)


def test_no_import_cycles() -> None:
    cycles = find_cycles(GRAPH[0])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("sglang_ssd.worker", "sglang_ssd.speculator"),
        ("sglang_ssd.speculator", "sglang_ssd.worker"),
        ("sglang_ssd.saguaro", "sglang_ssd.worker"),
        ("sglang_ssd.saguaro", "sglang_ssd.speculator"),
        # Process start-up and placement sit beneath both sides and what plugs into SGLang.
        ("sglang_ssd.launch", "sglang_ssd.worker"),
        ("sglang_ssd.launch", "sglang_ssd.speculator"),
        ("sglang_ssd.launch", "sglang_ssd.integration"),
    ],
)
def test_layers_do_not_import_each_other(importer: str, forbidden: str) -> None:
    """Directly or through other modules."""
    edges, _ = GRAPH
    chains = reachable(edges, [m for m in edges if _in(m, importer)])
    bad = [c for m, c in sorted(chains.items()) if _in(m, forbidden) and not _in(c[-2], forbidden)]
    assert not bad, f"{importer} imports {forbidden}: " + "; ".join(" -> ".join(c) for c in bad)


# What the serving processes start from: the launcher, SGLang's plugin (the scheduler and the
# TP/DP workers), the speculator process.
SERVING = [
    "sglang_ssd.launch_server",
    "sglang_ssd.integration.registration",
    "sglang_ssd.speculator.__main__",
]
# The build tools (the EAGLE-3 trainer, the draft vocabulary's counting, their corpus): offline,
# never loaded by a serving process (a missing vocabulary is counted in a subprocess).
BUILD_TOOLS = "sglang_ssd.build"


def test_serving_never_imports_the_build_tools() -> None:
    edges, _ = GRAPH
    assert all(m in edges for m in SERVING), "a listed serving module no longer exists"
    assert {"sglang_ssd.build.vocab", "sglang_ssd.build.eagle3_head"} <= edges.keys()
    chains = reachable(edges, SERVING)
    bad = [" -> ".join(c) for m, c in sorted(chains.items()) if _in(m, BUILD_TOOLS)]
    assert not bad, "serving imports a build tool: " + "; ".join(bad)


def external_imports(package: str) -> dict[str, str]:
    """Each external top-level package `package` reaches -> one import chain to it."""
    edges, external = GRAPH
    chains = reachable(edges, [m for m in edges if _in(m, package)])
    return {
        name: " -> ".join(chains[m]) for m in sorted(chains, reverse=True) for name in external[m]
    }


def test_saguaro_is_pure_math() -> None:
    """No SGLang, no processes or wire (zmq, msgspec), directly or through other modules."""
    reached = external_imports("sglang_ssd.saguaro")
    bad = [
        f"{reached[n]} imports {n}" for n in sorted(reached.keys() & {"sglang", "zmq", "msgspec"})
    ]
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("package", ["sglang_ssd.eagle3", "sglang_ssd.build"])
def test_heads_and_build_tools_import_torch_transformers_safetensors_only(package: str) -> None:
    """The EAGLE-3 package and the build tools run where SGLang is absent (a trainer, the GPU
    machine): besides the standard library, only torch, transformers, safetensors and tqdm."""
    allowed = {"torch", "transformers", "safetensors", "tqdm", *sys.stdlib_module_names}
    reached = external_imports(package)
    bad = [f"{reached[n]} imports {n}" for n in sorted(reached.keys() - allowed)]
    assert not bad, "; ".join(bad)
