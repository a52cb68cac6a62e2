"""The target side of SSD inside SGLang's scheduler process.

`ssd_worker` (the SGLang spec worker), `verify_step` (verify a round's drafts),
`draft_batch` (a round's drafts as the target receives them), `draft_provider` (where drafts
come from), `speculator_client` (requests and rounds over the link), `supervisor` (start,
watch and stop the speculator process) and `metrics` (per-round timers and per-request counts).
Stands on `transport/` and `saguaro/`; never imports `speculator/`.
"""
