"""Shared fixtures for the torchbridge tests.

torch is imported before tensorflow everywhere, the recommended order (docs/troubleshooting.md,
"Does the import order matter?"; tests/test_installs.py checks the others).
"""

import gc
import os

import numpy as np
import pytest
import torch  # noqa: F401  (must come before tensorflow)
import tensorflow as tf

import torchbridge as tb

# Captures are not kept on disk across the tests' processes (each test
# captures as a first process would); tests/test_disk_captures.py turns it
# on with a directory of its own. Subprocesses the tests start inherit it.
os.environ.setdefault("TORCHBRIDGE_CAPTURE_CACHE", "off")

# Two logical CPU devices, so MirroredStrategy tests have two replicas on this
# CPU-only machine. Must happen before TF's runtime starts (before any test
# runs an op); everything else keeps running on /CPU:0 as before.
tf.config.set_logical_device_configuration(
  tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)


def cuda_available():
  """Whether both torch and TF see a CUDA GPU."""
  return torch.cuda.is_available() and bool(tf.config.list_physical_devices("GPU"))


requires_gpu = pytest.mark.skipif(
  not cuda_available(), reason="needs a CUDA GPU visible to both torch and TF"
)


@pytest.fixture(autouse=True)
def _fresh_stats():
  """Every test starts with zeroed exchange counters."""
  tb.reset_exchange_stats()
  yield


@pytest.fixture
def own_crossings_only():
  """For tests that assert exact `exchange_stats()`: Python's cyclic garbage
  collector is held off while the test runs (explicit `gc.collect()` still
  works). Otherwise a wrapper an earlier test left in a reference cycle can
  be collected mid-test, and its torch module's copy-back (a counted copy)
  lands in this test's counters."""
  enabled = gc.isenabled()
  gc.disable()
  tb.reset_exchange_stats()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


@pytest.fixture(params=["eager", "function"])
def mode(request):
  """How a test body runs: eagerly, or traced by `tf.function`."""
  return request.param


@pytest.fixture
def in_mode(mode):
  """`in_mode(fn)` is `fn` eagerly, `tf.function(fn)` in graph mode, and
  `tf.function(fn, jit_compile=True)` in "xla" mode (a suite that asks for
  it overrides `mode`)."""

  def wrap(fn, **kwargs):
    if mode == "eager":
      return fn
    if mode == "xla":
      kwargs["jit_compile"] = True
    return tf.function(fn, **kwargs)

  return wrap


@pytest.fixture(params=[tf.float32, tf.float64], ids=["float32", "float64"])
def float_dtype(request):
  return request.param


def tolerance(dtype):
  """`(rtol, atol)` for comparing results computed in `dtype`."""
  if tf.as_dtype(dtype) == tf.float64:
    return {"rtol": 1e-12, "atol": 1e-12}
  return {"rtol": 2e-5, "atol": 2e-6}


def random_tf(shape, dtype, seed=0, low=-1.0, high=1.0):
  """A TF-owned tensor of uniform values (made by a TF op, not from numpy)."""
  rng = np.random.default_rng(seed)
  values = rng.uniform(low, high, size=shape)
  return tf.identity(tf.constant(values, dtype=dtype))


def rss_bytes():
  """The resident set size of this process."""
  with open("/proc/self/statm") as f:
    pages = int(f.read().split()[1])
  return pages * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def bridge_runner(monkeypatch):
  """Modules built with the default `run="auto"` take the torch runner (the
  bridge) in graph calls, on its Python path: for the tests of the bridge's
  own mechanics (its op, crossings, records, threads), which the TF runner
  and the C++ torch runner bypass (TORCHBRIDGE_TORCH_RUNNER=python, which
  subprocesses inherit). The default runner itself is tested in
  test_module_run.py, the C++ torch runner in test_torch_runner.py."""
  from torchbridge import _runners  # pylint: disable=import-outside-toplevel

  monkeypatch.setenv("TORCHBRIDGE_TORCH_RUNNER", "python")

  resolve = _runners.resolve_run

  def torch_by_default(run, torchscript, owner):
    return resolve("torch" if run == "auto" else run, torchscript, owner)

  monkeypatch.setattr(_runners, "resolve_run", torch_by_default)
