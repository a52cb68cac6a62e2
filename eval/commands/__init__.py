"""`python -m eval`'s subcommands, one module each.

Each module has `HELP` (its line in `python -m eval --help`), `add_arguments(parser)` and
`run(args) -> int`; `eval.__main__` lists them. What several share: `run_args` (the options of
an interleaved run and the settings they make), `interleaved` (running configurations and
comparing them), `plans` (the sweeps' plans, for `sweep` and `all`).
"""
