"""The TD3 example: the three backends agree, short runs work, kill-and-resume."""

import json
import os
import signal
import subprocess
import sys
import time

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
SCRIPT = os.path.join(EXAMPLES, "td3_pendulum.py")
sys.path.insert(0, EXAMPLES)

from td3 import agents  # noqa: E402
from _module_helpers import lines_before_progress  # noqa: E402

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow


def _batch(rng, n=32):
  return (
    rng.standard_normal((n, 3)).astype(np.float32),
    rng.uniform(-2, 2, (n, 1)).astype(np.float32),
    rng.standard_normal((n, 1)).astype(np.float32),
    rng.standard_normal((n, 3)).astype(np.float32),
    np.ones((n, 1), np.float32),
  )


@pytest.mark.parametrize(
  "backend,run", [("torchbridge", "auto"), ("torchbridge", "torch"), ("tf", "auto")]
)
def test_tf_backends_match_pure_torch_step_by_step(backend, run):
  # Without target-policy noise the algorithm is deterministic: the same
  # initial weights and batches must give the same losses and actions. SGD
  # in both frameworks (Keras' and torch's Adam place epsilon differently).
  hyper = agents.Hyper(policy_noise=0.0, noise_clip=0.0, batch_size=32, lr=0.05)
  reference = agents.TorchAgent(3, 1, 2.0, seed=3, hyper=hyper)
  reference.actor_opt = torch.optim.SGD(reference.actor.parameters(), hyper.lr)
  reference.critic_opt = torch.optim.SGD(reference.critic.parameters(), hyper.lr)
  agent = agents.TFAgent(backend, 3, 1, 2.0, seed=3, hyper=hyper, run=run)
  agent.actor_opt = tf.keras.optimizers.SGD(hyper.lr)
  agent.critic_opt = tf.keras.optimizers.SGD(hyper.lr)
  rng = np.random.default_rng(0)
  for _ in range(6):
    batch = _batch(rng)
    critic_ref, actor_ref = reference.train_step(*batch)
    critic_tf, actor_tf = (float(v) for v in agent.train_step(*batch))
    np.testing.assert_allclose(critic_tf, critic_ref, rtol=1e-4, atol=1e-5)
    if np.isnan(actor_ref):
      assert np.isnan(actor_tf)
    else:
      np.testing.assert_allclose(actor_tf, actor_ref, rtol=1e-4, atol=1e-5)
  obs = rng.standard_normal(3).astype(np.float32)
  np.testing.assert_allclose(agent.policy(obs), reference.policy(obs), rtol=1e-4, atol=1e-5)


def test_torchbridge_target_networks_follow_polyak_averaging():
  hyper = agents.Hyper(batch_size=16)
  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, seed=0, hyper=hyper)
  before_online = [v.numpy() for v in agent.actor.variables]
  before_target = [v.numpy() for v in agent.actor_target.variables]
  rng = np.random.default_rng(1)
  agent.train_step(*_batch(rng, 16))  # update 1: critic only
  for v, t0 in zip(agent.actor_target.variables, before_target):
    np.testing.assert_array_equal(v.numpy(), t0)
  agent.train_step(*_batch(rng, 16))  # update 2: actor and targets
  for online, target, o0, t0 in zip(
    agent.actor.variables, agent.actor_target.variables, before_online, before_target
  ):
    del o0
    expected = hyper.tau * online.numpy() + (1 - hyper.tau) * t0
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-6, atol=1e-7)


def _run(out, backend="torchbridge", steps=300, extra=(), **popen):
  cmd = [
    sys.executable,
    SCRIPT,
    "--backend",
    backend,
    "--steps",
    str(steps),
    "--seed",
    "0",
    "--out",
    str(out),
    "--start-steps",
    "100",
    "--eval-every",
    "100",
    "--eval-episodes",
    "1",
    "--checkpoint-every",
    "100",
    *extra,
  ]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen(
    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
  )


@pytest.mark.parametrize("backend", ["torchbridge", "torch", "tf"])
def test_short_run_writes_results_curve_and_checkpoints(tmp_path, backend):
  out = tmp_path / backend
  proc = _run(out, backend=backend, steps=300)
  log, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, log
  with open(out / "results.json") as f:
    results = json.load(f)
  assert results["backend"] == backend and results["seed"] == 0
  assert results["steps"] == 300
  assert [s for s, _ in results["eval_returns"]] == [100, 200, 300]
  assert all(np.isfinite(r) and r < 0 for _, r in results["eval_returns"])
  assert results["train_steps"] == 200
  assert results["sec_per_train_step"] > 0
  assert (out / "learning_curve.png").stat().st_size > 1000
  assert os.listdir(out / "tensorboard")
  assert (out / "checkpoints" / "progress.json").exists()
  assert "learning curve:" in log
  if backend == "torchbridge":
    assert results["exchange_stats"]["zero_copy"] > 0
    assert "crossed the TF/torch boundary" in log


def test_short_run_as_make_demo_runs_it(tmp_path):
  # make demo's flags: --export only; graph calls on the default runner
  # (the modules' TF translations): nothing crosses to torch in a train
  # step, so nothing is copied; the policy's eager calls run torch.
  results, log = _exported_short_run(tmp_path / "demo", ("--export",))
  assert results["exchange_stats"]["copied"] == 0
  # Nothing before the progress bar but what the script itself says.
  assert lines_before_progress(log) == [], log[:3000]


def _exported_short_run(out, extra):
  """300 steps with `extra` flags (--export among them): the results and
  the log, the run and its export checked."""
  proc = _run(out, steps=300, extra=extra)
  log, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, log
  results = json.loads((out / "results.json").read_text())
  assert results["train_steps"] == 200
  assert all(np.isfinite(r) for _, r in results["eval_returns"])
  assert results["export"]["equal"] and results["export"]["torch_importable_in_server"] is False
  return results, log


def test_short_run_on_the_torch_runner_and_its_refusal_elsewhere(tmp_path):
  # --run torch --export: the four modules' graph calls run torch, from C++.
  results, log = _exported_short_run(tmp_path / "torch_runner", ("--run", "torch", "--export"))
  if _loader_complete():
    # The critic's gradient for the action, a strided column, is copied
    # once on every second step (the actor's update), and nothing else.
    stats = results["exchange_stats"]
    assert stats["copied"] == results["train_steps"] // 2
    assert stats["bytes_copied"] == stats["copied"] * 256 * 4
  # Every graph call ran in C++ (where the op has torch's side): no call
  # said it took the Python path.
  assert "on the Python path" not in log
  paths = {r["path"] for r in results["runners"].values()}
  assert paths == ({"C++"} if _loader_complete() else {"Python"}), results["runners"]
  proc = _run(tmp_path / "torch", backend="torch", steps=10, extra=("--run", "torch"))
  log, _ = proc.communicate(timeout=240)
  assert proc.returncode != 0 and "--run is for the torchbridge backend" in log


def _loader_complete():
  from torchbridge._native import _loader

  return _loader.has_torch_interop()


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
  out = tmp_path / "run"
  proc = _run(out, steps=600)
  progress = out / "checkpoints" / "progress.json"
  deadline = time.time() + 200
  try:
    while time.time() < deadline:
      if progress.exists() and json.loads(progress.read_text())["env_step"] >= 200:
        break
      assert proc.poll() is None, proc.communicate()[0]
      time.sleep(0.2)
    else:
      pytest.fail("no checkpoint at step 200 within the time limit")
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.communicate()
  killed_at = json.loads(progress.read_text())["env_step"]
  assert 200 <= killed_at < 600

  proc = _run(out, steps=600)
  log, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, log
  assert f"resuming from checkpoint at step {killed_at}" in log
  results = json.loads((out / "results.json").read_text())
  assert results["resumed_from"] == killed_at
  # Evaluations before the kill were kept; the rest came after the resume.
  assert [s for s, _ in results["eval_returns"]] == [100, 200, 300, 400, 500, 600]
  # Every environment step after the random warm-up trained exactly once.
  assert results["train_steps"] == 500


def test_summary_tables_every_run_and_counts_seeds_reaching_the_threshold(tmp_path):
  runs = {
    ("torchbridge", 0): [[2000, -900.0], [4000, -240.0]],
    ("torchbridge", 1): [[2000, -1000.0], [4000, -400.0]],
    ("torch", 0): [[2000, -800.0], [4000, -150.0]],
  }
  for (backend, seed), returns in runs.items():
    run = tmp_path / f"{backend}_s{seed}"
    run.mkdir()
    (run / "results.json").write_text(
      json.dumps(
        {
          "backend": backend,
          "seed": seed,
          "steps": 4000,
          "eval_returns": returns,
          "sec_per_train_step": 0.004,
        }
      )
    )
  out = subprocess.run(
    [sys.executable, os.path.join(EXAMPLES, "td3_summary.py"), str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert "| torchbridge | 0 | -240.0 (step 4000) | 4000 | 4.00 |" in out.stdout
  assert "| torchbridge | 1 | -400.0 (step 4000) | not reached | 4.00 |" in out.stdout
  assert "torchbridge: 1 of 2 seeds reached -250" in out.stdout
  assert "torch: 1 of 1 seeds reached -250" in out.stdout
  assert (tmp_path / "learning_curve.png").stat().st_size > 1000


def test_bridged_process_has_no_more_threads_than_torch_plus_tf(tmp_path):
  """TD3 with 4 torch threads (OpenMP teams of 3 workers): the bridged
  process holds at most the pure-torch process's threads plus TF's own
  pools (the TF backend's threads, less the main thread both count)."""
  counts = {}
  for backend in ("torchbridge", "torch", "tf"):
    out = tmp_path / backend
    proc = _run(
      out,
      backend=backend,
      steps=200,
      extra=("--threads", "4", "--eval-every", "100000", "--checkpoint-every", "100000"),
    )
    log, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log
    counts[backend] = json.loads((out / "results.json").read_text())["threads_at_end"]
  assert counts["torchbridge"] <= counts["torch"] + counts["tf"] - 1, counts


def test_trained_actor_is_served_without_torch(tmp_path):
  # make demo's last step: the bridged actor translated to TF ops, saved,
  # and run in a process where torch cannot be imported.
  from td3 import export  # pylint: disable=import-outside-toplevel

  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, seed=0, hyper=agents.Hyper())
  for v in agent.actor.trainable_variables:  # as if trained: not the init
    v.assign_add(tf.random.normal(v.shape, stddev=0.05, seed=1))
  exported = export.export_actor(agent.actor, 3, str(tmp_path))
  assert exported["torch_importable_in_server"] is False
  assert exported["equal"], exported
  assert exported["max_abs_diff_served_vs_bridge"] < 1e-5
  assert os.path.isdir(os.path.join(tmp_path, "actor_savedmodel"))
  # The served model reads the trained values: a different actor differs.
  agent.actor.trainable_variables[-1].assign_add(tf.ones_like(agent.actor.trainable_variables[-1]))
  actions = tf.saved_model.load(exported["savedmodel"])(tf.zeros([1, 3]))
  assert not np.allclose(actions.numpy(), agent.actor(tf.zeros([1, 3])).numpy())
