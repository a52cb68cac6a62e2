"""Process start-up and placement: how the server's processes start and where they run.

`zygote` (a preloaded process that forks the launcher's or the speculator's children with their
imports done), `fork_start` (SGLang's "spawn" children forked from a preloaded forkserver),
`placement` (the speculator's device or cores, pinning, core lending), `replica_cpus` (each
data-parallel replica's cores) and `cpu_lists` (the Linux CPU-list form they all read and write).
The entry point stays `python -m sglang_ssd.launch_server`. Stands on `sglang_ssd.config` only;
never imports `worker/`, `speculator/`, `saguaro/` or `integration/` (tests/test_import_graph.py).
"""
