"""`tb.torch_function` at run time: memory, threads and devices."""

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from conftest import random_tf
from conftest import requires_gpu
from conftest import rss_bytes
from torchbridge._native import _loader
from torchbridge._call import _saved


# --- Calls that never get a backward keep nothing. ---


def test_ten_thousand_inference_calls_in_tf_function_leak_nothing():
  live_records = []

  @tb.torch_function
  def affine(x, scale):
    if not x.is_meta:
      # Records still alive while this call runs: its predecessors' would
      # pile up here if a forward without backward leaked.
      live_records.append(len(_saved._SAVED_BY_HANDLE))
    return torch.tanh(x * scale + 1.0)

  # 64 KiB per output: 10,000 leaked outputs (and their autograd graphs)
  # would be more than 600 MiB.
  x = random_tf([8192], tf.float64, seed=1)

  @tf.function
  def loop(x, n):
    acc = tf.zeros_like(x)
    for _ in tf.range(n):
      acc += affine(x, 0.5)
    return acc

  loop(x, tf.constant(200))  # trace and warm up allocators
  gc.collect()
  rss_before = rss_bytes()
  live_records.clear()
  acc = loop(x, tf.constant(10000))
  gc.collect()
  rss_growth = rss_bytes() - rss_before

  np.testing.assert_allclose(acc.numpy(), 10000 * np.tanh(x.numpy() * 0.5 + 1.0), rtol=1e-9)
  assert len(live_records) == 10000
  assert max(live_records) <= 2
  assert len(_saved._SAVED_BY_HANDLE) == 0
  assert rss_growth < 64 * 2**20, f"RSS grew by {rss_growth / 2**20:.1f} MiB"


def test_tape_without_gradient_in_tf_function_keeps_nothing():
  bridged = tb.torch_function(lambda a: torch.exp(a) * 3)

  @tf.function
  def step(a, want_gradient):
    with tf.GradientTape() as tape:
      tape.watch(a)
      y = tf.reduce_sum(bridged(a))
    if want_gradient:
      return y, tape.gradient(y, a)
    return y, tf.zeros_like(a)

  a = tf.constant([0.0, 1.0])
  for want_gradient in (False, True, False):
    y, grad = step(a, want_gradient)
    gc.collect()
    assert len(_saved._SAVED_BY_HANDLE) == 0
  np.testing.assert_allclose(y.numpy(), 3 * (1 + np.e), rtol=1e-6)
  np.testing.assert_allclose(step(a, True)[1].numpy(), 3 * np.exp([0.0, 1.0]), rtol=1e-6)


def test_eager_inference_calls_leak_nothing():
  bridged = tb.torch_function(lambda a: torch.tanh(a) * 2)
  x = random_tf([16384], tf.float32, seed=2)
  for _ in range(100):
    bridged(x)
  gc.collect()
  rss_before = rss_bytes()
  for _ in range(3000):
    y = bridged(x)
  gc.collect()
  rss_growth = rss_bytes() - rss_before
  np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy()) * 2, rtol=1e-6)
  # 3,000 leaked outputs of 64 KiB would be about 190 MiB.
  assert rss_growth < 32 * 2**20, f"RSS grew by {rss_growth / 2**20:.1f} MiB"


# --- Threads. ---


def _run_threads(target, n_threads=4):
  errors = []
  barrier = threading.Barrier(n_threads)

  def guarded(k):
    try:
      barrier.wait()
      target(k)
    except BaseException as err:  # reported in the main thread
      errors.append(err)

  threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n_threads)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  if errors:
    raise errors[0]


def test_concurrent_calls_are_correct():
  @tb.torch_function
  def fn(a, b):
    h = torch.sin(a) * b
    for _ in range(3):  # some work, so that threads interleave
      h = h + 0.0 * torch.tanh(h @ h.T).sum()
    return h

  def step(a, b):
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      y = tf.reduce_sum(fn(a, b))
    return y, tape.gradient(y, [a, b])

  traced = tf.function(step)
  traced(tf.ones([8, 8], tf.float64), tf.ones([8, 8], tf.float64))
  checked = []

  def worker(k):
    for i in range(15):
      a = random_tf([8, 8], tf.float64, seed=100 * k + i)
      b = random_tf([8, 8], tf.float64, seed=100 * k + i + 50)
      a_np, b_np = a.numpy(), b.numpy()
      for call in (step, traced):
        y, (grad_a, grad_b) = call(a, b)
        np.testing.assert_allclose(y.numpy(), (np.sin(a_np) * b_np).sum(), rtol=1e-12)
        np.testing.assert_allclose(grad_a.numpy(), np.cos(a_np) * b_np, rtol=1e-12)
        np.testing.assert_allclose(grad_b.numpy(), np.sin(a_np), rtol=1e-12)
        checked.append(k)

  _run_threads(worker)
  assert len(checked) == 4 * 15 * 2


_THREAD_STATE_CHECK = """
import threading
import torch
import tensorflow as tf
import torchbridge as tb

local = threading.local()
seen = []  # per call: (thread id, whether that thread had run a call)

@tb.torch_function
def fn(x):
  if not x.is_meta:
    seen.append((threading.get_ident(), getattr(local, "ran", False)))
    local.ran = True
  return x * 2

traced = tf.function(lambda x: fn(x))
x = tf.ones([3])
for _ in range(30):
  assert traced(x).numpy().tolist() == [2.0, 2.0, 2.0]
assert len(seen) == 30
first_calls = [ran for _, ran in seen].count(False)
assert first_calls == len({ident for ident, _ in seen}), seen
print("native" if tb.native_available() else "py_function", first_calls)
"""


@pytest.mark.parametrize("path", ["native", "py_function"])
def test_tf_threads_keep_their_python_thread_state(path):
  # Whichever op runs the callback, the TF thread that runs it keeps one
  # Python thread state, so a threading.local() survives between calls (a
  # fresh thread state per call loses it, and costs every call). In a fresh
  # process: one thread kept by an earlier test would hide a regression.
  env = dict(os.environ)
  env.pop(_loader.DISABLE_ENV, None)
  if path == "py_function":
    env[_loader.DISABLE_ENV] = "1"
  elif not _loader.available():
    pytest.skip("the native op is not available here")
  proc = subprocess.run(
    [sys.executable, "-c", _THREAD_STATE_CHECK],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert proc.stdout.split()[-2] == path, proc.stdout[-3000:]


# --- GPU: torch runs where the TF tensors are. ---


@requires_gpu
def test_gpu_inputs_run_torch_on_the_gpu(mode):
  seen = {}

  @tb.torch_function
  def fn(a, b):
    if not a.is_meta:
      seen["device"] = a.device.type
      seen["ptr"] = a.data_ptr()
    return (a @ b).sum(dim=1)

  with tf.device("GPU:0"):
    a = tf.identity(random_tf([512, 512], tf.float32, seed=3))
    b = tf.identity(random_tf([512, 512], tf.float32, seed=4))

  def step(a, b):
    with tf.GradientTape() as tape:
      tape.watch(a)
      y = fn(a, b)
      loss = tf.reduce_sum(y)
    return y, tape.gradient(loss, a)

  call = step if mode == "eager" else tf.function(step)
  with tf.device("GPU:0"):
    y, grad = call(a, b)
  assert seen["device"] == "cuda"
  if mode == "eager":
    assert seen["ptr"] == tb.to_torch(a).data_ptr()
  assert "GPU" in y.device
  expected = (a.numpy().astype(np.float64) @ b.numpy()).sum(axis=1)
  np.testing.assert_allclose(y.numpy(), expected, rtol=1e-3)
  np.testing.assert_allclose(grad.numpy(), np.tile(b.numpy().sum(axis=1), [512, 1]), rtol=1e-3)
