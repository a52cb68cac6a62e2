"""The target side of SSD inside SGLang's scheduler process.

`ssd_worker` (the SGLang spec worker), `verify_step` (verify a round's drafts),
`draft_batch` (a round's drafts as the target receives them), `draft_provider` (the
`DraftSupplier` protocol and the target's own n-gram drafts), `speculator_client` (requests and
rounds over the link), `supervisor` (start, watch, fault, restart and stop the speculator
process) and `metrics` (per-round timers and per-request counts). Placement of the speculator
is `sglang_ssd.placement`. Stands on `transport/` and `saguaro/`; never imports `speculator/`
(tests/test_import_graph.py checks it).
"""
