"""The native op's hand-off to its torch thread on a busy machine
(csrc/torch_thread.h): every spin setting gives the same bits, a contended
core stops the spin, one torch thread serves every call, and nothing hangs
beside a busy or a stopped competitor. Each case runs in a child process
pinned to one core (so a competitor there contends for certain), with a
timeout: a hang or a crash fails one test."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torchbridge._native import _loader
from torchbridge._runtime import _torch_thread

native_only = pytest.mark.skipif(
  not _loader.available(), reason="the native op is not available here"
)

CHILD = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    import numpy as np
    import torch
    import tensorflow as tf
    import torchbridge as tb
    from torchbridge._native import _loader

    competitor_mode = sys.argv[1]  # none, busy or stopped
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    assert _loader.load() is not None
    lib = ctypes.CDLL(str(_loader.loaded_from()))
    def counter(name):
      fn = getattr(lib, name)
      fn.restype = ctypes.c_int64
      return fn()

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    reference = {k: v.detach().clone() for k, v in net.named_parameters()}
    layer = tb.TorchModule(net, name="net", run="torch")
    x = tf.constant(np.random.default_rng(0).standard_normal((16, 3), dtype=np.float32))

    @tf.function
    def grads(x):
      with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(y * y)
      return y, tape.gradient(loss, layer.trainable_variables)

    y, g = grads(x)  # traced and captured before any competitor starts
    competitor = None
    if competitor_mode != "none":
      competitor = subprocess.Popen([sys.executable, "-c",
          "import os; os.sched_setaffinity(0, {0})\\nwhile True: pass"])
      time.sleep(0.3)
      if competitor_mode == "stopped":
        os.kill(competitor.pid, signal.SIGSTOP)
    grads(x)  # the torch thread ended while idle: this call starts it again
    started_before = counter("torchbridge_torch_threads_started")
    start = time.perf_counter()
    outputs = []
    for i in range(60):
      if competitor_mode == "stopped" and i == 30:
        os.kill(competitor.pid, signal.SIGCONT)  # busy again for the rest
      y, g = grads(x)
      outputs.append((y.numpy().tobytes().hex(), [t.numpy().tobytes().hex() for t in g]))
    seconds = time.perf_counter() - start
    if competitor is not None:
      competitor.kill()
      competitor.wait()

    # Pure torch, eagerly, on the same weights: the bits the bridge must give.
    pure = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    pure.load_state_dict(reference)
    x_torch = torch.from_numpy(x.numpy())
    y_torch = pure(x_torch)
    (y_torch * y_torch).sum().backward()
    names = [v.name.split("/", 1)[1].split(":")[0] for v in layer.trainable_variables]
    params = dict(pure.named_parameters())
    expected = (y_torch.detach().numpy().tobytes().hex(),
                [params[n].grad.numpy().tobytes().hex() for n in names])
    print(json.dumps({
      "same_bits_every_call": all(o == outputs[0] for o in outputs),
      "as_pure_torch": outputs[0][0] == expected[0] and outputs[0][1] == expected[1],
      "first": outputs[0][0][:32],
      "seconds": seconds,
      "contended": counter("torchbridge_handoff_contended"),
      "spin_mode": counter("torchbridge_handoff_spin_mode"),
      "threads_started": counter("torchbridge_torch_threads_started") - started_before,
      "inline_fallbacks": counter("torchbridge_torch_thread_inline_fallbacks"),
    }))
    sys.stdout.flush()
    os._exit(0)
""")


def _child(competitor, spin="adaptive", timeout=240):
  env = {
    **os.environ,
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TORCHBRIDGE_TORCH_THREAD_SPIN": spin,
  }
  for name in ("TORCHBRIDGE_TORCH_THREAD", "TORCHBRIDGE_TORCH_RUNNER"):
    env.pop(name, None)  # the torch thread, and graph calls on the C++ runner
  try:
    out = subprocess.run(
      [sys.executable, "-c", CHILD, competitor],
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
      check=False,
    )
  except subprocess.TimeoutExpired:
    pytest.fail(f"bridged calls beside a {competitor} competitor did not finish in {timeout} s")
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@native_only
@pytest.mark.parametrize("spin", ["adaptive", "always", "never"])
def test_every_spin_setting_gives_pure_torchs_bits(spin):
  result = _child("none", spin=spin)
  assert result["spin_mode"] == {"adaptive": -1, "always": 1, "never": 0}[spin]
  assert result["same_bits_every_call"]
  assert result["as_pure_torch"]
  assert result["threads_started"] == 0  # the one torch thread served them all
  assert result["inline_fallbacks"] == 0


@native_only
def test_a_contended_core_stops_the_spin_and_one_thread_serves_every_call():
  # A competitor spinning on the same (only) core: the first yield that
  # hands it the core marks the hand-off contended.
  result = _child("busy")
  assert result["contended"] >= 1
  assert result["same_bits_every_call"] and result["as_pure_torch"]
  assert result["threads_started"] == 0
  assert result["inline_fallbacks"] == 0


@native_only
def test_a_stopped_then_resumed_competitor_hangs_nothing():
  result = _child("stopped")
  assert result["same_bits_every_call"] and result["as_pure_torch"]
  assert result["threads_started"] == 0


@native_only
def test_spinning_always_beside_a_competitor_still_completes():
  result = _child("busy", spin="always")
  assert result["contended"] == 0  # the setting turns the watch off
  assert result["same_bits_every_call"] and result["as_pure_torch"]


@pytest.mark.parametrize(
  "value, reported",
  [(None, "adaptive"), ("always", "always"), ("never", "never"), ("adaptive", "adaptive")],
)
def test_info_reports_the_spin_setting(monkeypatch, value, reported):
  if value is None:
    monkeypatch.delenv(_torch_thread.SPIN_ENV, raising=False)
  else:
    monkeypatch.setenv(_torch_thread.SPIN_ENV, value)
  assert _torch_thread.spin_setting() == reported


def test_an_unknown_spin_setting_is_reported_as_the_default_it_becomes(monkeypatch):
  monkeypatch.setenv(_torch_thread.SPIN_ENV, "sometimes")
  reported = _torch_thread.spin_setting()
  assert reported.startswith("adaptive (")
  assert "'sometimes'" in reported and "always, never" in reported


def test_info_json_shows_the_spin_setting_in_effect():
  out = subprocess.run(
    [sys.executable, "-m", "torchbridge", "info", "--json"],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", _torch_thread.SPIN_ENV: "never"},
    check=False,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout)["threads"]["torch_thread_spin"] == "never"
