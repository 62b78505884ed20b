# Two entry points, each doing all set-up on a fresh machine:
#   make demo   - set up .venv, run the main job
#   make test   - set up .venv, run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo ppo test test-long check test-user user-venv test-pythons bench bench-user bench-runners bench-load bench-real bench-rl runner-coverage bench-build soak venv clean docs lint

venv: $(STAMP)

# Rebuilt only when the pinned requirements or the package metadata change.
$(STAMP): requirements-dev.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# tf_keras would pull the `tensorflow` package beside `tensorflow-cpu`;
	# both install the same files, so it goes in without its dependencies.
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps tf_keras==2.21.0
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: TD3 on Pendulum with a torch actor-critic in a TF loop,
# 20,000 steps as the RL Zoo schedules them (10,000 random, then each
# episode's train steps in one graph call; about a minute and a half on 2
# cores). Its modules are plain
# tb.TorchModule(...): graph calls run each module's exact TF translation
# (captured and checked against torch once; torch through the bridge where
# it cannot hold, said once). Starts afresh each time. Ends
# by serving the trained actor without torch: translated to TF ops
# (tb.translate), saved as a SavedModel, run in a process where torch
# cannot be imported, its actions compared with the bridge's.
DEMO_STEPS ?= 20000
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) examples/td3_pendulum.py --backend torchbridge --steps $(DEMO_STEPS) --seed 0 --out runs/demo --export --jit-compile

# The recurrent job: PPO with a torch LSTM actor-critic on CartPole without
# velocities, one seed, the README's budget (about 5 minutes on 2 cores): a
# rollout's PPO epochs in one graph call, acting through the torch network.
ppo: $(STAMP)
	rm -rf runs/ppo_demo
	$(PY) examples/ppo_lstm_cartpole.py --steps 150000 --seed 0 --out runs/ppo_demo/lstm_masked_torchbridge_s0

# The suite with the native TF op (csrc/, built on first use and cached),
# then the call path's suites again with the tf.py_function path forced:
# all but those marked one_pass (they do not depend on the path) and those
# marked slow. The slow suites (module_db, transformers, the examples, Ray,
# the installs, the benchmarks, the docs' code: their graph calls take the
# default TF runner; the tf.py_function path is the call path's suites' to
# test) are `make test-long`'s, which CI runs too.
#
# Both (and make test-user) run on TEST_WORKERS pytest-xdist workers, by
# default what the machine holds: one a core, at most one per 4 GiB of
# memory (each worker holds torch and TF, ~3 GB); a test file a worker
# (--dist loadfile: a file's module fixtures and its files stay together;
# the native op's build holds a file lock, so it is built once).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; \
  mem = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'); \
  print(max(1, min(os.cpu_count() or 1, mem // 2**32)))")
XDIST = -n $(TEST_WORKERS) --dist loadfile
test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=25 -m "not slow" tests
	TORCHBRIDGE_DISABLE_NATIVE=1 $(PY) -m pytest -q $(XDIST) --durations=25 -m "not one_pass and not slow" tests

# The long suites (those marked slow), on the native op: module_db,
# transformers, the examples, Ray, the installs, the benchmarks' smoke
# runs, the docs' code.
# DOCS_BLOCKS=optional (CI): the docs' code blocks that need no optional
# package run in `make test-user` only, in what users install.
DOCS_BLOCKS ?= all
test-long: $(STAMP)
	TORCHBRIDGE_DOCS_BLOCKS=$(DOCS_BLOCKS) $(PY) -m pytest -q $(XDIST) --durations=25 -m slow tests

# The contributor's loop, under 5 minutes here: lint, type check, and the
# tests of the call path, the exchange and the layering on the native op,
# without the suites marked slow (module_db, transformers, the installs,
# the examples, the benchmarks, the docs' code), which `make test` and CI
# run.
CHECK_TESTS := tests/test_function.py tests/test_function_runtime.py \
	tests/test_module.py tests/test_module_errors.py \
	tests/test_module_training.py tests/test_swap.py tests/test_vjp.py \
	tests/test_exchange.py tests/test_native.py \
	tests/test_native_torch_tensors.py tests/test_keras_layer.py \
	tests/test_call_protocol.py tests/test_layering.py tests/test_layout.py \
	tests/conformance tests/test_trace_fallback.py
check: lint
	$(PY) -m pytest -q -m "not slow" $(CHECK_TESTS)

# Lint: ruff (lint and format check) over the repository, mypy over the
# package (pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The documentation site (docs/, mkdocs.yml) into site/: MkDocs with Material,
# the API pages generated from the docstrings by mkdocstrings. --strict: a
# broken link, a missing reference or a docstring that does not render
# fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# What a user gets, as a second environment: a fresh venv, the torch that
# `pip install torch` gives today (requirements-user.txt: the CUDA build
# every Linux x86_64 user gets from PyPI; it brings triton and the CUDA
# libraries, and runs on the CPU here), and torchbridge installed
# non-editable the README's way (`pip install .[cpu]`). PIP_CONSTRAINT is
# emptied for it: a user has no local cap on torch's version (these
# machines' pip configuration has one). The tests run from tests/ with
# `python -P`, so they import the installed package, not the source tree:
# the import-order matrix, the README's code blocks, the quick-start
# example, torch's lazily loaded native code, and the native op a user gets
# (complete, built and reported by `python -m torchbridge`), and torch
# inside XLA from the installed sources, and the capture's skip of torch's
# run_decompositions against torch's module_db (which needs expecttest,
# the one test-only package added). Then what a
# user sees: `python -m torchbridge info`, and the README example's first
# graph call on the torch runner timed with an empty cache (the build
# included) and a warm one, then on the default runner (the capture).
USER_VENV := .venv-user
USER_PY := $(USER_VENV)/bin/python
USER_REQUIREMENTS ?= requirements-user.txt
USER_TESTS := test_installs.py test_readme.py test_quickstart.py \
	test_torch_lazy_native.py test_native_cli.py test_cuda_warning.py \
	test_torch_runner.py test_module_run.py test_handoff.py test_xla.py \
	test_export_decompose.py
user-venv:
	rm -rf $(USER_VENV)
	$(PYTHON) -m venv $(USER_VENV)
	$(USER_PY) -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null $(USER_PY) -m pip install --quiet \
	  -r $(USER_REQUIREMENTS) ".[cpu]" pytest pytest-xdist==3.8.0 \
	  $$(grep -E "^expecttest==" requirements-dev.txt)
	$(USER_PY) -c "import importlib.util as u, sys; \
	  sys.exit('triton missing: not a user install' if u.find_spec('triton') is None else 0)"
	$(USER_PY) -m pip list 2>/dev/null | grep -E -i "^(torch|triton|tensorflow[-_a-z]*|keras|torchbridge) "

test-user: user-venv
	cd tests && TORCHBRIDGE_USER_INSTALL=1 ../$(USER_PY) -P -m pytest -q \
	  -p no:cacheprovider $(XDIST) --durations=10 $(USER_TESTS)
	cd tests && ../$(USER_PY) -P -m torchbridge info
	cache=$$(mktemp -d) && cd tests && for run in cold warm; do \
	  printf "README example, run=\"torch\", first graph call, $$run cache: "; \
	  TORCHBRIDGE_CACHE_DIR=$$cache TF_CPP_MIN_LOG_LEVEL=3 \
	    ../$(USER_PY) -P ../benchmarks/first_call.py --run torch || exit 1; \
	done; printf "README example, default runner (its capture), first graph call: "; \
	TORCHBRIDGE_CACHE_DIR=$$cache TF_CPP_MIN_LOG_LEVEL=3 \
	  ../$(USER_PY) -P ../benchmarks/first_call.py || exit 1; rm -rf $$cache

# Each supported Python (3.10-3.13) as a user gets it: a fresh venv
# (build/pythons/3.X, removed after its run unless KEEP=1), torchbridge
# installed the README's way, `pip install ".[cpu]"`, with PIP_CONSTRAINT
# emptied as for `make user-venv`, but without requirements-user.txt's pin:
# each Python gets the torch and TensorFlow that pip picks for it (torch
# 2.15 has no wheel for Python 3.10, where pip picks 2.14.1). Then the
# quick-start example (examples/quickstart.py) and `python -m torchbridge
# info` (which builds the native op for that Python), both run from the
# venv's folder so that they import the installed package, not the source
# tree. The interpreter is `python3.X` where that runs, else pyenv's latest
# 3.X. Each Python's output goes to build/pythons/3.X.log; one row a Python
# (versions, pass or the step that failed, the date) goes to
# benchmarks/results/pythons.md. Exits 1 if any failed. Downloads torch
# once per Python (pip's cache keeps the rest): the four took 16 minutes
# on 2 cores, the first the longest.
# TEST_PYTHONS="3.12" for one.
TEST_PYTHONS ?= 3.10 3.11 3.12 3.13
PYTHONS_DIR := build/pythons
PYTHONS_LOG := benchmarks/results/pythons.md
test-pythons:
	mkdir -p $(PYTHONS_DIR)
	@root=$$(pwd); failed=""; rows=""; \
	for v in $(TEST_PYTHONS); do \
	  venv=$$root/$(PYTHONS_DIR)/$$v; log=$$root/$(PYTHONS_DIR)/$$v.log; \
	  py=python$$v; $$py -c pass 2>/dev/null || \
	    py=$$(pyenv root 2>/dev/null)/versions/$$(pyenv latest $$v 2>/dev/null)/bin/python; \
	  echo "== Python $$v ($$py): $$log"; : > $$log; step=interpreter; \
	  $$py -c pass >>$$log 2>&1 && step=venv && \
	  rm -rf $$venv && $$py -m venv $$venv >>$$log 2>&1 && step=install && \
	  $$venv/bin/python -m pip install --quiet --upgrade pip >>$$log 2>&1 && \
	  PIP_CONSTRAINT=/dev/null $$venv/bin/python -m pip install --quiet \
	    ".[cpu]" >>$$log 2>&1 && step=quickstart && \
	  (cd $$venv && TF_CPP_MIN_LOG_LEVEL=2 bin/python $$root/examples/quickstart.py) \
	    >$$log.quickstart 2>&1; status=$$?; cat $$log.quickstart >>$$log 2>/dev/null; \
	  test $$status = 0 && grep -q "outputs identical = True" $$log.quickstart && \
	  step=info && (cd $$venv && bin/python -m torchbridge info) >>$$log 2>&1 && step=pass; \
	  rm -f $$log.quickstart; \
	  versions=$$(cd $$venv 2>/dev/null && bin/python -c "import sys, importlib.metadata as m; \
	    print(sys.version.split()[0], '|', m.version('torch'), '|', m.version('tensorflow-cpu'))" \
	    2>/dev/null || echo "$$v | - | -"); \
	  if [ $$step = pass ]; then result=pass; else result="FAIL ($$step)"; failed="$$failed $$v"; fi; \
	  echo "== Python $$v: $$result"; \
	  rows="$$rows| $$versions | $$result | $$(date -u +%Y-%m-%d) |\n"; \
	  test -n "$(KEEP)" || rm -rf $$venv; \
	done; \
	{ printf '# `make test-pythons`\n\n'; \
	  printf 'Each Python in a fresh venv, torchbridge installed with `pip install ".[cpu]"`, '; \
	  printf 'then `examples/quickstart.py` and `python -m torchbridge info`; Linux x86_64, CPU only.\n\n'; \
	  printf '| Python | torch | tensorflow-cpu | result | date |\n|---|---|---|---|---|\n'; \
	  printf "$$rows"; } > $(PYTHONS_LOG); \
	cat $(PYTHONS_LOG); test -z "$$failed" || { echo "failed:$$failed"; exit 1; }

# QUICK=1: the smoke run, 60-80 s here (the test suite runs it too).
bench: $(STAMP)
	$(PY) -m benchmarks $(if $(QUICK),--quick --out benchmarks/results/quick)

# The per-call figures and the TD3 script (torchbridge, pure torch, the
# leanest Python bridge) in the development venv and in the user-install
# venv (made by `make test-user` if missing), side by side; and the native op's
# build, before and after issue 25, with the README example's first call.
bench-user: $(STAMP)
	test -x $(USER_PY) || $(MAKE) user-venv
	$(PY) -m benchmarks.per_call_venvs --python $(PY) --python $(USER_PY)
	# The TD3 example's own needs (the user venv has the package's only).
	PIP_CONSTRAINT=/dev/null $(USER_PY) -m pip install --quiet gymnasium matplotlib tensorboard
	$(PY) -m benchmarks.td3_venvs --python $(PY) --python $(USER_PY)

# Graph calls' runners side by side (issue 40): TD3 and the small MLP with
# the default TorchModule (TF runner), XLA, run="torch", the Keras port with
# and without XLA and pure torch, in both venvs, alternated
# (benchmarks/results/runners.{json,md}, included by the docs); then the C++
# torch runner's TD3 step against its floor with its callback time put back
# (benchmarks/results/busy_floor.{json,md}).
bench-runners: $(STAMP)
	test -x $(USER_PY) || $(MAKE) user-venv
	PIP_CONSTRAINT=/dev/null $(USER_PY) -m pip install --quiet gymnasium
	$(PY) -m benchmarks.runners --python $(PY) --python $(USER_PY)
	$(PY) -m benchmarks.busy_floor --python $(PY) --python $(USER_PY)

# On a busy machine (issue 42): the same step for Keras, each runner and pure
# torch, quiet and beside busy processes (same nice, nice 19), the hand-off's
# spin settings, pure torch's remedies, and a DDPG-shaped loop against its
# Keras twin (benchmarks/results/load*.{json,md}, ddpg_loop.*). About 40 min;
# run it on an otherwise idle machine.
bench-load: $(STAMP)
	$(PY) -m benchmarks.load
	$(PY) -m benchmarks.load --remedies
	$(PY) -m benchmarks.load --breakdown --rounds 3
	$(PY) -m benchmarks.ddpg_loop

# Real-size models (benchmarks/real_models.py, issue 54): BERT-base and
# GPT-2 small training, GPT-2 inference, ResNet-18 training NCHW and
# channels-last, each in pure torch, tb.TorchModule (default runner; again
# in a second process sharing its capture cache), run="torch" and keras-hub's
# TF-native model; each (task, contender) in a process of its own, nothing
# else meanwhile, REAL_ROUNDS rounds alternated
# (benchmarks/results/real_models.{json,md}, included by the docs). The
# benchmark-only packages go in pinned, without their dependencies
# (keras-hub's would bring tensorflow-text and a second TensorFlow).
# torchvision goes in only beside a CUDA build of torch: PyPI's torchvision
# 0.28.0 (torch 2.13's) is built against CUDA torch and cannot be imported
# beside the CPU torch of .venv; there the script runs torchvision's
# ResNet-18 definition, copied (the same modules and initialisation).
# About 35 minutes a round on 2 cores, estimated; run it on an otherwise
# idle machine. REAL_ARGS="--tasks bert-train --rounds 1" for a part,
# REAL_ARGS=--tiny for the smoke run (a few minutes).
REAL_ROUNDS ?= 2
REAL_ARGS ?=
bench-real: $(STAMP)
	$(PY) -m pip install --quiet --no-deps keras-hub==0.32.0 kagglehub==1.0.2 \
	  kagglesdk==0.1.28 sentencepiece==0.2.3
	if $(PY) -c "import torch, sys; sys.exit(torch.version.cuda is None)"; then \
	  $(PY) -m pip install --quiet --no-deps torchvision==0.28.0; fi
	$(PY) -m benchmarks.real_models --rounds $(REAL_ROUNDS) $(REAL_ARGS)

# The main jobs against Stable-Baselines3 (benchmarks/results/rl_jobs.{json,md}):
# TD3 20k and PPO-LSTM 150k, three seeds each, about 75 minutes on 2 cores.
RL_ARGS ?=
bench-rl: $(STAMP)
	$(PY) -m benchmarks.rl_jobs $(RL_ARGS)

# Which runner torch's module_db and the tiny transformers models take on the
# default path (benchmarks/results/runner_coverage.{json,md}), and which
# torch path with run="torch" (benchmarks/results/torch_runner_coverage.*).
runner-coverage: $(STAMP)
	$(PY) -m benchmarks.runner_coverage
	$(PY) -m benchmarks.runner_coverage --run torch

bench-build: $(STAMP)
	$(PY) -m benchmarks.build_time
	test ! -x $(USER_PY) || $(USER_PY) -m benchmarks.build_time

# The soak (issue 28): 100,000 bridged training steps of a small MLP,
# eagerly and in tf.function, and a TD3 run of 100,000 environment steps
# (examples/td3_pendulum.py), each in a process of its own, the three at
# once; resident memory, open descriptors, threads and exchange copies,
# sampled every 1,000 steps, must stay flat after warm-up (the bounds in
# benchmarks/soak.py; exit 1 names the one that failed). Writes
# benchmarks/results/soak.json (the curves) and soak.png. Not part of
# `make test`, which runs a short one (tests/test_soak.py). SOAK_STEPS=N
# for a shorter run.
SOAK_STEPS ?= 100000
soak: $(STAMP)
	$(PY) -m benchmarks.soak --steps $(SOAK_STEPS) --parallel

clean:
	rm -rf $(VENV) $(USER_VENV) build *.egg-info
