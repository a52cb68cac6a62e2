"""The evaluation harness: real servers, real prompt sets, interleaved runs, one JSON per run.

- `datasets`: HumanEval and MT-Bench prompts from their installed packages, chat-templated ids.
- `servers`: start/stop `python -m sglang_ssd.launch_server` (free port, pinning, logs, no orphans).
- `sampling`: `Sampling`, a request's sampling settings (server requests and offline verifies).
- `client`: timed `/generate` requests with `input_ids` at a given concurrency.
- `configs`: `Config` (a configuration as data, read with the launcher's own flag defaults),
  named configurations (AR, STANDALONE, ...) and a JSON loader.
- `harness`: `run_interleaved` (what a run is, resuming); `interleave` runs its units; both read
  `run_settings` (`RunSettings`). `results_io`: a results file read back, its per-batch rows
  gzipped beside it (`pack`).
- `cpuload`, `provenance`: how busy the machine was and the waits for a quiet one; machine,
  versions, git state and model folders.
- `summary`: tok/s, accept length, ratios, output identity, the printed table.
- `ssd_stats`, `ssd_bench`: SSD's counters around a batch and the speedup model; the SSD benchmark.
- `sweep`: the paper's experiments as plans of runs; sweeps of SSD's live settings on one server.
- `result_rows`, `figures`, `report`: the rows read from results files, their PNGs, and the
  markdown report with their tables.
- `trace` (record / replay), `bench_speculator`, `bench_verify`, `lossless`, `load`,
  `distribution` (the T > 0 distribution check: power / run), `margin` (ε of the greedy rule,
  measured): offline and single-purpose tools, each `python -m eval.<name>`.

`commands`: one module per `python -m eval` subcommand. Run `python -m eval --help`.
"""
