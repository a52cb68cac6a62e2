"""Build tools: what makes a draft's derived artefacts from local text, offline.

- `corpus`: the local text both builders read, and the one rule (`corpus.excluded`) for what
  they never read (evaluation sets, SGLang's tests and benchmarks, this project).
- `vocab`: counts the reduced draft vocabulary (`--ssd-draft-vocab`) into the cache that
  `speculator.draft_vocab` reads; ``python -m sglang_ssd.build.vocab``.
- `eagle3_head`, `train`, `ttt`, `answers`, `evaluate`, `target_pass`: train an EAGLE-3 head
  (`python -m sglang_ssd.models build eagle3`) in the format `sglang_ssd.eagle3` loads.

No serving process imports this package (tests/test_import_graph.py): the vocabulary is counted
by the CLI in a subprocess on a cache miss (`speculator.draft_vocab.load_or_build`).
"""
