"""The evaluation harness: real servers, real prompt sets, interleaved runs, one JSON per run.

- `datasets`: HumanEval and MT-Bench prompts from their installed packages, chat-templated ids.
- `servers`: start/stop `python -m sglang_ssd.launch_server` (free port, pinning, logs, no orphans).
- `client`: timed `/generate` requests with `input_ids` at a given concurrency.
- `harness`: `Config` (a configuration as data) and `run_interleaved`.
- `configs`: named configurations (AR, STANDALONE, ...) and a JSON loader.
- `cpuload`, `provenance`: how busy the machine was; machine, versions and git state.
- `summary`: tok/s, accept length, ratios, output identity, the printed table.
- `sweep`: the paper's experiments as plans of runs; sweeps of SSD's live settings on one server.
- `figures`, `report`: PNGs and the markdown report from the results files.

Run `python -m eval --help`.
"""
