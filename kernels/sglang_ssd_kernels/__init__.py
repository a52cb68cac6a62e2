"""Pure-torch kernels for sglang-ssd.

`cpu_ops` implements the `sgl_kernel` CPU ops that SGLang's CPU engine calls (Intel's CPU
build of `sgl_kernel` is not on PyPI); the `sgl_kernel` module itself comes from the small
`sgl-kernel-torch-cpu` distribution in `kernels/sgl_kernel_shim`, which re-exports them.
`branch_attention` is the SSD speculator's tree-decode attention.

This package imports with torch alone: no SGLang, no compiled extension.
"""

__version__ = "0.1.0"
