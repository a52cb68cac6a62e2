# sglang-ssd: see README.md. Every target installs what it needs first.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.sglang-ssd-installed
INSTALL_INPUTS := scripts/install.sh scripts/install_placeholders.py scripts/apply_patches.py \
	$(wildcard requirements/*.txt) pyproject.toml kernels/pyproject.toml \
	kernels/sgl_kernel_shim/pyproject.toml $(wildcard patches/*.patch)
# Extra flags for `make serve`, e.g. make serve SERVE_ARGS="--port 30001".
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: install models serve test test-real test-unit lint bench bench-quick gpu-check gpu-run gpu-wheels clean

install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	PYTHON=$(PYTHON) bash scripts/install.sh
	@touch $@

models: install
	$(VPY) -m sglang_ssd.models pull all

serve: models
	$(VPY) -m sglang_ssd.launch_server $(SERVE_ARGS)

lint: install
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

# Everything that starts no server (markers `integration`, `real`, `server`: pyproject.toml).
test-unit: install
	$(VPY) -m pytest -m "not integration and not real and not server" $(PYTEST_ARGS)

# CI's suite: every test but the real-pair checks marked `real` (deselected, not skipped). One
# process, tests in file order except the real pair's smoke, which runs first: several checks
# time the speculator against the target (accept lengths, hit rates, stalls) and need the
# machine to themselves.
test: lint models
	$(VPY) -m pytest -m "not real" $(PYTEST_ARGS)

# The real-pair checks outside CI's budget (docs/testing.md); run it for every change to the
# decode round, the draft runtime or the target's verify.
test-real: models
	$(VPY) -m pytest -m real $(PYTEST_ARGS)

# The paper's experiments, figures and report (resumes an interrupted run); see docs/benchmarks.md.
bench: models
	$(VPY) -m eval all $(BENCH_ARGS)

bench-quick: models
	$(VPY) -m eval all --quick $(BENCH_ARGS)

# The GPU checks (tests/gpu, marker `gpu`) with the machine's own python3: the GPU machine has
# torch, triton and pytest but no sglang and nothing installed. tests/gpu/pytest.ini keeps
# tests/conftest.py out; without CUDA the CUDA cases are skipped with the reason.
gpu-check:
	$(PYTHON) -m pytest -c tests/gpu/pytest.ini --confcutdir=tests/gpu tests/gpu -m gpu \
		--durations=0 $(PYTEST_ARGS)

# The one device script (<= about 4.5 min): environment records, the GPU checks, then
# eval.gpu_model's timings on a small grid, all to $OUT, one `check NAME: ...` line per check.
# Run `make gpu-wheels` first where the package index is reachable and carry gpu-wheels/ with
# the run: the GPU machine reaches no index (docs/cuda.md#gpu-checks).
gpu-run:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh

# msgspec, pyzmq and psutil wheels for the GPU machine's CPython 3.12 (about 1.2 MB).
gpu-wheels:
	PYTHON=$(PYTHON) bash scripts/gpu_wheels.sh gpu-wheels

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
