"""The T > 0 distribution check: SSD's samples against the target's exact law, with its power.

`tests/integration/test_ssd_distribution.py` runs it at CI's size; `python -m eval.distribution
run` runs it at the full size (TV 0.03 resolved at 90% power in the hardest direction) and
writes eval/results/distribution-full.json; `python -m eval.distribution power` prints the
power table. The test module's docstring states the design, the sizes and the power.

- `tiny_pair`: the sharp tiny target and its draft, and samplers with a broken verify rule.
- `reference`: the exact law of the first generated tokens, as cells.
- `statistic`: Pearson's χ² over cells merged by the reference.
- `power`: the test's power by simulation, per bias direction and sample size.
- `draws`: samples from live AR and SSD servers.
- `run`: negative controls, the servers' χ², the verdict and the results file.
"""
