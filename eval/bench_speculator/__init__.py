"""Time the speculator's round against the target's verify, each on its own core.

T_p (docs/design.md#speedup-model-theorem-7, Theorem 7) is the speculator's time to build the next
round's cache in units
of one target verify. Two worker subprocesses run at the same time, as SSD deploys them on two
CPUs: each pins itself to one core (`os.sched_setaffinity`, `torch.set_num_threads(1)`) before it
loads its model.
- draft worker (0.5B through `--draft-runtime`, default the server's: int8 on a CPU;
  `SpeculatorEngine`, async, β = 1, geometric fan-out): the time of `engine.build` (glue forward +
  D tree-decode forwards + fork/sample/populate) for fan-out budget B, tree depth D and batch size
  b, in steady state: the draft being extended is a depth-D cache hit, as in a hit round. Also the
  just-in-time draft (γ sequential one-token forwards, the SD baseline's drafting cost) per b.
- target worker (1.5B, bf16, transformers + `DynamicCache`): one verify of γ + 1 tokens per
  request (forward over [root, d_1..d_γ] on a ~`--prefix`-token prefix, then `saguaro.verify`),
  per b, repeated until the draft worker is done.

Every sample records the cores other processes kept busy meanwhile (`Stopwatch`); medians use
the clean samples (<= 0.25 foreign cores) when there are at least 3, and the draft worker adds
passes (up to `--max-repeats`) until every point has `--repeats` clean samples.

Per (b, D) group the draft worker opens b requests on fresh ~`--prefix`-token prefixes, serves a
JIT draft (timed), does one unmeasured warm-up build and hit, then one measured build per B (each
followed by a hit on the smallest accept length, so the prefix grows by ~1 token per point).
Repeats rotate the order of b and D and reverse the order of B; medians of >= 5 repeats are
reported with every raw time, the command line and the load average before and after.

Usage: python -m eval.bench_speculator [--repeats 5] [--wait-load 2.5] [--out PATH]
"""
