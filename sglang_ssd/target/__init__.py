"""The target's int8 path on CPU: SGLang's `--quantization ssd_int8`.

`int8_kernel` holds the matmul (int8 weights per output row, int8 activations per row, exact
int32 accumulation), `int8_cache` the quantised weights cached beside the checkpoint, and
`int8_method` the quantization method SGLang's model loader and linear layers call.
"""

METHOD = "ssd_int8"  # the `--quantization` name (SGLang's flag)
