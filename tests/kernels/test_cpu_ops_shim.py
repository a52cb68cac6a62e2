"""The `sgl_kernel` module: what SGLang's CPU path imports, placeholders, torch.ops schemas."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
import sgl_kernel
import torch
from sglang_source import sglang_file
from sglang_ssd_kernels.cpu_ops import registry

# Module-level CPU imports that stay placeholders: linear-attention (mamba/GDN/KDA) kernels.
NOT_IMPLEMENTED = {"sgl_kernel.mamba"}
# CPU-path imports outside an `if is_cpu` branch: IntelAMXMultiStepDraftBackend.__init__ and
# kernels/ops/speculative/reconstruct_tree.py (`elif not _is_xpu`).
OTHER_CPU_IMPORTS = {
    ("sgl_kernel", "build_draft_decode_metadata_cpu"),
    ("sgl_kernel.speculative", "reconstruct_indices_from_tree_mask"),
}


def cpu_branch_imports() -> set[tuple[str, str]]:
    """(module, name) of each `from sgl_kernel[.x] import name` in an `is_cpu` branch of SGLang."""
    found = set()
    root = sglang_file("")
    for path in [*root.joinpath("srt").rglob("*.py"), *root.joinpath("kernels").rglob("*.py")]:
        text = path.read_text(errors="ignore")
        if not _cpu_guarded_import_nearby(text):
            continue  # parsing all ~100 files that import sgl_kernel takes 10 s
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.If) and "is_cpu" in ast.unparse(node.test)):
                continue
            for stmt in node.body:  # the CPU branch itself, not its elif/else
                if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith(
                    "sgl_kernel"
                ):
                    found |= {(stmt.module, alias.name) for alias in stmt.names}
    return found


def _cpu_guarded_import_nearby(text: str, window: int = 8) -> bool:
    lines = text.splitlines()
    return any(
        "from sgl_kernel" in line
        and any("is_cpu" in prev for prev in lines[max(0, i - window) : i])
        for i, line in enumerate(lines)
    )


def test_every_cpu_branch_import_resolves() -> None:
    imports = cpu_branch_imports()
    assert ("sgl_kernel", "copy_all_layer_kv_cache_cpu") in imports  # the scan found the sites
    for module, name in sorted(imports | OTHER_CPU_IMPORTS):
        target = getattr(__import__(module, fromlist=[name]), name)
        if module in NOT_IMPLEMENTED:
            with pytest.raises(NotImplementedError, match="no pure-torch implementation"):
                target()
        else:
            assert target.__module__.startswith("sglang_ssd_kernels"), (module, name)


def test_n_gram_op_comes_from_the_speculative_submodule() -> None:
    from sgl_kernel.speculative import reconstruct_indices_from_tree_mask

    assert reconstruct_indices_from_tree_mask.__module__ == "sglang_ssd_kernels.cpu_ops.ngram"
    from sgl_kernel import speculative

    assert inspect.ismodule(speculative)


def test_unknown_names_raise_only_when_called() -> None:
    from sgl_kernel import some_cuda_only_kernel  # import succeeds

    with pytest.raises(
        NotImplementedError,
        match=r"^sgl_kernel\.some_cuda_only_kernel has no pure-torch implementation in sglang-ssd$",
    ):
        some_cuda_only_kernel(torch.zeros(1))
    assert sgl_kernel.some_cuda_only_kernel is some_cuda_only_kernel
    with pytest.raises(AttributeError):
        sgl_kernel._private_probe  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        __import__("sgl_kernel.kvcacheio")


def hasattr_probes() -> set[str]:
    """Names SGLang tests with `hasattr(torch.ops.sgl_kernel, "...")` anywhere in the wheel."""
    probe = re.compile(r'hasattr\(\s*torch\.ops\.sgl_kernel,\s*"(\w+)"')
    root = sglang_file("")
    return {
        name
        for path in root.rglob("*.py")
        for name in probe.findall(path.read_text("utf-8", "ignore"))
    }


def test_torch_ops_registered_and_probes_stay_absent() -> None:
    ops = torch.ops.sgl_kernel
    assert hasattr(ops, "decode_attention_cpu") and hasattr(ops, "extend_attention_cpu")
    probes = hasattr_probes()
    assert "convert_weight_packed" in probes  # the scan works
    assert probes <= registry.PROBED_BY_SGLANG, "new hasattr probe: list it in registry.py"
    for name in probes:
        assert not hasattr(ops, name), name
    assert registry.register_torch_ops() == []  # idempotent


@pytest.mark.parametrize(
    ("attribute", "op"),
    [
        ("decode_attention_fwd", "decode_attention_cpu"),
        ("extend_attention_fwd", "extend_attention_cpu"),
    ],
)
def test_schema_arity_matches_intel_amx_call_site(attribute: str, op: str) -> None:
    """The intel_amx backend calls each op positionally; the schema must take exactly those."""
    tree = ast.parse(sglang_file("srt/layers/attention/intel_amx_backend.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == f"self.{attribute}"
    ]
    assert len(calls) == 1
    schema = getattr(torch.ops.sgl_kernel, op).default._schema
    assert len(calls[0].args) == len(schema.arguments) and not calls[0].keywords
