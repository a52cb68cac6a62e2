"""ε of the greedy rule (docs/design.md#the-greedy-rule), measured: where do SGLang's decode and
TARGET_VERIFY
disagree on the argmax, and how small is the target's fp32 top-2 margin there?

Method (`python -m eval.margin`): an AR server (`--speculative-algorithm NONE`: every output
token after the first comes from a DECODE forward) and an SSD server (every output token after
the first comes from a TARGET_VERIFY forward, its logprobs from SGLang's `compute_spec_logprobs`
over the verify logits) answer the same greedy requests with `top_logprobs_num` 2. Along the
common prefix of the two outputs the contexts are equal, so each position gives the decode and
the verify top-2 of one teacher-forced context; at the first divergence the argmaxes differ.
The measurement then continues teacher-forced: prompt + common prefix + AR's token is sent to
both servers as a new request. Position 0 of every request is excluded (it comes from the
prefill's EXTEND forward on both servers).

Modules: `segments` (one request pair → the aligned positions), `chains` (per-prompt state,
resumable JSON), `measure` (the concurrent loop over both servers), `eps` (fp32 margins at the
differing positions and the ε rule), `__main__` (command line).
"""
