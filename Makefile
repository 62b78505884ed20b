# Two entry points, each doing all set-up on a fresh machine:
#   make demo   - set up .venv, run the main job
#   make test   - set up .venv, run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo ppo test test-user bench venv clean

venv: $(STAMP)

# Rebuilt only when the pinned requirements or setup.py change.
$(STAMP): requirements-dev.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# tf_keras would pull the `tensorflow` package beside `tensorflow-cpu`;
	# both install the same files, so it goes in without its dependencies.
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps tf_keras==2.21.0
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: TD3 on Pendulum with a torch actor-critic in a TF loop,
# a short budget (about 5 minutes on 2 cores). Starts afresh each time. Ends
# by serving the trained actor without torch: translated to TF ops
# (tb.translate), saved as a SavedModel, run in a process where torch
# cannot be imported, its actions compared with the bridge's.
DEMO_STEPS ?= 20000
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) examples/td3_pendulum.py --backend torchbridge --steps $(DEMO_STEPS) --seed 0 --out runs/demo --export

# The recurrent job: PPO with a torch LSTM actor-critic on CartPole without
# velocities, one seed, the README's budget (about 6 minutes on 2 cores).
ppo: $(STAMP)
	rm -rf runs/ppo_demo
	$(PY) examples/ppo_lstm_cartpole.py --steps 150000 --seed 0 --out runs/ppo_demo/lstm_masked_torchbridge_s0

# The whole suite twice: with the native TF op (csrc/, built on first use
# and cached) and with the tf.py_function path forced.
test: $(STAMP)
	$(PY) -m pytest -q tests
	TORCHBRIDGE_DISABLE_NATIVE=1 $(PY) -m pytest -q tests

# What a user gets, as a second environment: a fresh venv, torch from the
# package index (the CUDA build every Linux x86_64 user gets from PyPI; it
# brings triton and the CUDA libraries, and runs on the CPU here), and
# torchbridge installed non-editable the README's way (`pip install .[cpu]`).
# The tests run from tests/ with `python -P`, so they import the installed
# package, not the source tree: the import-order matrix, the README's code
# blocks, the quick-start example, torch's lazily loaded native code.
USER_VENV := .venv-user
USER_PY := $(USER_VENV)/bin/python
USER_TORCH ?= torch==2.14.1
USER_TESTS := test_installs.py test_readme.py test_quickstart.py \
	test_torch_lazy_native.py
test-user:
	rm -rf $(USER_VENV)
	$(PYTHON) -m venv $(USER_VENV)
	$(USER_PY) -m pip install --quiet --upgrade pip
	$(USER_PY) -m pip install --quiet "$(USER_TORCH)" ".[cpu]" pytest
	$(USER_PY) -c "import importlib.util as u, sys; \
	  sys.exit('triton missing: not a user install' if u.find_spec('triton') is None else 0)"
	$(USER_PY) -m pip list 2>/dev/null | grep -E -i "^(torch|triton|tensorflow[-_a-z]*|keras|torchbridge) "
	cd tests && TORCHBRIDGE_USER_INSTALL=1 ../$(USER_PY) -P -m pytest -q \
	  -p no:cacheprovider $(USER_TESTS)

# QUICK=1: the smoke run, 60-80 s here (the test suite runs it too).
bench: $(STAMP)
	$(PY) -m benchmarks $(if $(QUICK),--quick --out benchmarks/results/quick)

clean:
	rm -rf $(VENV) $(USER_VENV) build *.egg-info
