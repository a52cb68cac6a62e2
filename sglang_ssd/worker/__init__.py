"""The target side of SSD inside SGLang's scheduler process.

`ssd_worker` (the SGLang spec worker), `verify_step` (verify a round's drafts),
`draft_batch` (a round's drafts as the target receives them), `draft_provider` (the
`DraftSupplier` protocol and the target's own n-gram drafts), `planner` (each round's mode,
backup and tree depth, and the measurements they rest on), `speculator_client` (request sync and
Step/Drafts over the link, with `request_messages` and `drafts_reply` translating),
`speculator_admin` (live settings and counters over the link), `supervisor` (start, watch,
fault, restart, stop and core lending of the speculator process) and `metrics` (per-round
timers and per-request counts). Placement of the speculator
is `sglang_ssd.launch.placement`. Stands on `transport/` and `saguaro/`; never imports `speculator/`
(tests/test_import_graph.py checks it).
"""
