# Two entry points, each doing all set-up on a fresh machine:
#   make demo   - set up .venv, run the main job
#   make test   - set up .venv, run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

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
# a short budget (about 5 minutes on 2 cores). Starts afresh each time.
DEMO_STEPS ?= 20000
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) examples/td3_pendulum.py --backend torchbridge --steps $(DEMO_STEPS) --seed 0 --out runs/demo

# The whole suite twice: with the native TF op (csrc/, built on first use
# and cached) and with the tf.py_function path forced.
test: $(STAMP)
	$(PY) -m pytest -q tests
	TORCHBRIDGE_DISABLE_NATIVE=1 $(PY) -m pytest -q tests

# QUICK=1: the under-a-minute smoke run (the test suite runs it too).
bench: $(STAMP)
	$(PY) -m benchmarks $(if $(QUICK),--quick --out benchmarks/results/quick)

clean:
	rm -rf $(VENV) build *.egg-info
