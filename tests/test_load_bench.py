"""The load benchmark and the DDPG-shaped loop (benchmarks/load*.py,
benchmarks/ddpg_loop.py): every contender computes what its twin does,
and the tables read the figures they are given."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch  # before TensorFlow
import tensorflow as tf

from benchmarks import ddpg_loop
from benchmarks import load
from benchmarks import load_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]


def _scalar(loss):
  return float(loss.detach() if isinstance(loss, torch.Tensor) else loss)


@pytest.mark.parametrize("contender", load_process.CONTENDERS)
def test_every_contenders_step_trains_the_same_network(contender):
  step = load_process.build(contender, "step")
  losses = [_scalar(step()) for _ in range(3)]
  assert np.all(np.isfinite(losses))
  assert losses[2] < losses[0]  # Adam on a fixed batch: the loss goes down
  act = load_process.build(contender, "eager")
  action = act()
  assert np.asarray(action).shape == (1, 1)


def test_the_bridged_contenders_start_from_pure_torchs_weights():
  # Same seed, same torch network: the first loss of each torch-backed
  # contender is pure torch's to float rounding.
  first = {c: _scalar(load_process.build(c, "step")()) for c in load_process.CONTENDERS[1:]}
  np.testing.assert_allclose(list(first.values()), first[load_process.PURE_TORCH], rtol=1e-5)


def test_the_timed_process_prints_its_median_and_niceness():
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.load_process",
      load_process.KERAS,
      "step",
      "--seconds",
      "0.05",
      "--repeats",
      "2",
      "--nice",
      "5",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  assert record["nice"] >= 5 and len(record["samples_us"]) == 2
  assert record["median_us"] == float(np.median(record["samples_us"]))


def _busy_children():
  out = subprocess.run(
    ["ps", "-o", "args=", "--ppid", str(os.getpid())], capture_output=True, text=True, check=False
  )
  return [line for line in out.stdout.splitlines() if "while True: pass" in line]


def test_busy_processes_run_while_asked_and_are_gone_after():
  with load.busy(2):
    assert len(_busy_children()) == 2
  assert not _busy_children()  # killed and reaped


def _record(what, contender, condition, spin, median):
  return {
    "what": what,
    "contender": contender,
    "condition": condition,
    "spin": spin,
    "median_us": median,
  }


def test_the_load_table_shows_each_ratio_to_the_contenders_own_quiet_step():
  results = []
  for i, contender in enumerate(load_process.CONTENDERS):
    for j, condition in enumerate(load.CONDITIONS):
      results.append(_record("step", contender, condition, "adaptive", 1000.0 * (i + 1) * (j + 1)))
    for condition in ("quiet", "busy1"):
      results.append(_record("eager", contender, condition, "adaptive", 100.0 * (i + 1)))
  for contender in load.TORCH_RUNNERS:
    for spin in load.SPINS[1:]:
      for condition in ("quiet", "busy1", "nice19 busy1"):
        results.append(_record("step", contender, condition, spin, 7000.0))
  data = {
    "environment": {
      "source": {"commit": "abcdef0123"},
      "torch": "t",
      "tensorflow": "f",
      "cpu_count": 2,
    },
    "rounds": 1,
    "results": results,
  }
  table = load.markdown(data)
  assert "at abcdef0" in table
  # Keras (the first contender): 1 ms quiet, 3 ms beside two busy processes.
  assert "| keras | 1.00 (1.00x) | 2.00 (2.00x) | 3.00 (3.00x) |" in table
  assert "| 7.00 | 7.00 | 7.00 |" in table  # a spin setting's row
  # Eager: pure torch (the fifth contender) takes 5x Keras' time.
  assert f"| {load_process.PURE_TORCH} | 500 | 500 | 5.00x |" in table


def test_the_ddpg_loop_runs_each_backend_and_times_every_part():
  for backend in ddpg_loop.BACKENDS:
    record = ddpg_loop.loop(backend, steps=5)
    assert set(record["parts_s"]) == set(ddpg_loop.PARTS)
    assert all(v > 0 for v in record["parts_s"].values())
    # The parts are timed inside the loop: they cannot exceed its wall time.
    assert sum(record["parts_s"].values()) <= record["loop_s"]
    assert np.isfinite(record["last_loss"])


def test_the_ddpg_targets_move_by_tau():
  actor, _, target_actor, _ = ddpg_loop.networks(ddpg_loop.BRIDGE)
  before = [w.copy() for w in target_actor.get_weights()]
  source = actor.get_weights()
  for w in actor.weights:
    w.assign(w + 1.0)
  moved = [
    w * ddpg_loop.TAU + t * (1 - ddpg_loop.TAU)
    for w, t in zip(actor.get_weights(), target_actor.get_weights())
  ]
  target_actor.set_weights(moved)
  for after, b, s in zip(target_actor.get_weights(), before, source):
    np.testing.assert_allclose(
      after, (s + 1.0) * ddpg_loop.TAU + b * (1 - ddpg_loop.TAU), rtol=1e-6
    )
  # The torch module behind the target sees the moved weights.
  x = np.ones((1, 3), np.float32)
  y_tf = target_actor(tf.constant(x)).numpy()
  y_torch = target_actor.torch_module(torch.from_numpy(x)).detach().numpy()
  np.testing.assert_array_equal(y_tf, y_torch)


def test_the_pendulum_is_gymnasiums():
  gym = pytest.importorskip("gymnasium")
  env = gym.make("Pendulum-v1")
  obs, _ = env.reset(seed=0)
  ours = ddpg_loop.Pendulum(0)
  ours.theta, ours.omega = env.unwrapped.state
  np.testing.assert_allclose(ours.observe(), obs, rtol=1e-6)
  for torque in (0.5, -2.0, 1.3):
    obs, reward, *_ = env.step(np.array([torque], np.float32))
    mine, my_reward = ours.step(torque)
    np.testing.assert_allclose(mine, obs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(my_reward, reward, rtol=1e-5)
