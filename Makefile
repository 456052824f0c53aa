# One Makefile for people and CI. `make demo` and `make test` install first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# pyenv shims exist for every version but only run the selected one: try real interpreters first.
PYTHON312 ?= $(shell for p in $$(ls -1d $$HOME/.pyenv/versions/3.12.*/bin/python3.12 2>/dev/null) $$(command -v python3.12); do $$p -c "import sys; assert sys.version_info[:2]==(3,12)" 2>/dev/null && echo $$p && break; done)
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.roboloop-installed
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# precompile every installed module (~70 s here, once; first starts are then faster); `COMPILE_BYTECODE=` skips it
COMPILE_BYTECODE ?= --compile-bytecode
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export DO_NOT_TRACK ?= 1
export HF_HUB_OFFLINE ?= 1
export PYTHONHASHSEED ?= 0
# OpenMP threads sleep while they wait: two test workers, and their children, share two cores (bench/contention.py)
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help install demo test test-fast lint docs bench clean server serve pools deploy worker-cpu worker-gpu s3 cluster-demo gpu-check

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv/ with everything (idempotent; re-runs only when pins change)

$(STAMP): pyproject.toml constraints/py312.txt
	@# ffmpeg (videos); Chromium's headless shell + its driver (the `ui` tests drive Prefect's UI in a real browser);
	@# iproute2 + util-linux (tests/cluster's test hosts: network namespaces, infra/testbed.py); PostgreSQL (the
	@# control host's Prefect database, as a team runs it); Mesa's EGL (MuJoCo renders the sim-to-sim SO-101's cameras
	@# offscreen, in software where there is no GPU)
	@command -v ffmpeg >/dev/null && command -v chromium-headless-shell >/dev/null && command -v chromedriver \
	  >/dev/null && command -v ip >/dev/null && command -v unshare >/dev/null && ls /usr/lib/postgresql/*/bin/initdb \
	  >/dev/null 2>&1 && ldconfig -p | grep -q libEGL_mesa || { $(SUDO) apt-get update -qq && \
	  $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg chromium-headless-shell chromium-driver \
	  iproute2 util-linux postgresql libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null; }
	@[ -n "$(PYTHON312)" ] || { echo "Python 3.12 not found: install it (pyenv install 3.12) or pass PYTHON312=/path/to/python3.12"; exit 1; }
	@[ -x $(PY) ] || $(PYTHON312) -m venv $(VENV)
	@[ -x $(VENV)/bin/uv ] || $(PY) -m pip install -q uv==0.9.11
	$(VENV)/bin/uv pip install --python $(PY) $(COMPILE_BYTECODE) -c constraints/py312.txt -e ".[all]"
	@# gym-pusht asks for opencv-python, which would clash with the headless OpenCV already pinned
	$(VENV)/bin/uv pip install --python $(PY) --no-deps gym-pusht==0.1.8
	@touch $(STAMP)

demo: install  ## the whole closed loop on embedded defaults (ephemeral Prefect, local DVC remote and registry)
	$(PY) -m flows.demo

# `make test` runs in TEST_WORKERS pytest-xdist workers (one per core, at most 4), which share the cores
# (OMP_NUM_THREADS: one thread each on 2 cores); the longest work units go first (tests/schedule.py).
# TEST_WORKERS=0: one process, the benches' smoke runs beside it (tests/e2e/background.py)
NPROC        := $(shell nproc 2>/dev/null || echo 1)
TEST_WORKERS ?= $(shell echo $$(( $(NPROC) < 4 ? $(NPROC) : 4 )))
test: install  ## run the whole test suite (every marker this machine can run; one line per test, as it ends)
	@if [ "$(TEST_WORKERS)" -gt 0 ]; then t=$$(( $(NPROC) / $(TEST_WORKERS) )); t=$$(( t > 0 ? t : 1 )); \
	  export OMP_NUM_THREADS=$$t MKL_NUM_THREADS=$$t OPENBLAS_NUM_THREADS=$$t; \
	  dist="-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder"; echo "$(TEST_WORKERS) workers, $$t thread(s) each"; fi; \
	  set -x; PYTHONUNBUFFERED=1 $(PY) -m pytest -v -p no:cacheprovider --durations=30 $$dist

test-fast: install  ## unit tests only
	$(PY) -m pytest -q tests/unit -m "not slow"

docs: install  ## the docs site on http://127.0.0.1:8000 (reference pages regenerated from the code first)
	$(PY) docs/generate.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

lint: install  ## ruff + mypy
	$(VENV)/bin/ruff check roboloop tasks flows tests bench docs examples
	$(VENV)/bin/mypy

bench: install  ## benchmarks against the reference tools (each prints one JSON line)
	$(PY) bench/convert.py
	$(PY) bench/loader.py
	$(PY) bench/packing.py
	$(PY) bench/eval.py
	$(PY) bench/overhead.py
	$(PY) bench/so101.py
	$(PY) bench/serve.py
	$(PY) bench/optim.py
	$(PY) bench/act_step.py

MODEL ?= registry:reach-vla@champion
serve: install  ## serve MODEL (default the demo's champion, followed on promotion) on 127.0.0.1:8765 (token: .roboloop/serve-token)
	$(PY) -m roboloop.cli serve $(MODEL)

server: install  ## local Prefect server on 127.0.0.1:4200 (SQLite; Postgres for a shared one: see infra/server.sh)
	infra/server.sh

pools: install  ## process work pools `cpu` and `gpu` on $$PREFECT_API_URL
	infra/with-auth.sh infra/pools.sh

deploy: pools  ## register every deployment of deployments/prefect.yaml
	ROBOLOOP_HOME=$(CURDIR) infra/with-auth.sh $(VENV)/bin/prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml

worker-cpu: install  ## a process worker for the cpu pool
	infra/with-auth.sh $(PY) infra/worker.py -- $(VENV)/bin/prefect worker start --pool cpu

worker-gpu: install  ## a process worker for the gpu pool (one per GPU node, one training at a time)
	infra/with-auth.sh $(PY) infra/worker.py -- $(VENV)/bin/prefect worker start --pool gpu --limit 1

gpu-check: install  ## every pending GPU figure in one run of at most 8 minutes (one H100/H200): one JSON line
	mkdir -p bench/results && $(PY) bench/gpu_check.py --out bench/results/gpu-check-$$(date +%Y%m%d).json

cluster-demo: install  ## the scheduled retraining on test hosts: Prefect+PostgreSQL, S3, two GPU-pool nodes (root; ~10 min)
	$(PY) infra/cluster_demo.py

s3: install  ## moto S3 server on 127.0.0.1:5555 for local S3 development
	infra/moto-s3.sh

clean:  ## remove caches and demo outputs (keeps .venv)
	rm -rf .roboloop .pytest_cache build *.egg-info
