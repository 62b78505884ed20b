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


def _filled_buffer(rows=500, seed=2):
  from td3 import replay  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(seed)
  buffer = replay.ReplayBuffer(3, 1, capacity=rows)
  for _ in range(rows):
    buffer.add(
      rng.standard_normal(3),
      rng.uniform(-2, 2, 1),
      rng.standard_normal(),
      rng.standard_normal(3),
      rng.random() < 0.1,
    )
  return buffer


@pytest.mark.parametrize("backend", ["torchbridge", "tf"])
def test_a_burst_in_one_graph_call_is_its_steps_one_by_one(backend):
  # The burst's while_loop draws each batch in the graph, then the step's
  # target noise, from the agent's generator; a twin agent (same seed, so
  # the same stream) drawing the same indices eagerly, one train_step
  # each, ends at the same losses and weights.
  hyper = agents.Hyper(batch_size=32)
  buffer = _filled_buffer()
  burst = agents.TFAgent(backend, 3, 1, 2.0, seed=4, hyper=hyper, capacity=buffer.capacity)
  twin = agents.TFAgent(backend, 3, 1, 2.0, seed=4, hyper=hyper)
  burst.replay.sync_from(buffer)
  critic_loss, actor_loss = burst.train_burst(tf.constant(5))
  expected_actor_loss = None
  for _ in range(5):
    index = twin.rng_tf.uniform([32], 0, buffer.size, dtype=tf.int32).numpy()
    expected_critic_loss, loss = twin.train_step(*(column[index] for column in buffer.columns()))
    if not np.isnan(loss):
      expected_actor_loss = loss
  assert int(burst.updates.numpy()) == int(twin.updates.numpy()) == 5
  np.testing.assert_allclose(float(critic_loss), float(expected_critic_loss), rtol=1e-5)
  np.testing.assert_allclose(float(actor_loss), float(expected_actor_loss), rtol=1e-5)
  for module in ("actor", "critic", "actor_target", "critic_target"):
    for a, b in zip(getattr(burst, module).variables, getattr(twin, module).variables):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  # The weights moved: a burst that trained nothing would fail above only
  # if the twin trained, so check it did.
  fresh = agents.TFAgent(backend, 3, 1, 2.0, seed=4, hyper=hyper)
  assert not np.allclose(fresh.critic.variables[0].numpy(), burst.critic.variables[0].numpy())


def test_a_burst_compiled_by_xla_trains_as_the_graph_does():
  # The same batches (XLA draws the same uniform integers), no target noise
  # (XLA's normal samples differ from TF's kernel's for the same state).
  hyper = agents.Hyper(batch_size=32, policy_noise=0.0, noise_clip=0.0)
  buffer = _filled_buffer()
  results = []
  for jit_compile in (False, True):
    agent = agents.TFAgent(
      "torchbridge",
      3,
      1,
      2.0,
      seed=5,
      hyper=hyper,
      capacity=buffer.capacity,
      jit_compile=jit_compile,
    )
    agent.replay.sync_from(buffer)
    agent.train_burst(tf.constant(4))
    results.append([v.numpy() for v in agent.critic.variables + agent.actor.variables])
  for a, b in zip(*results):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_the_policys_torch_call_reads_what_the_last_burst_trained():
  # policy_call="torch" (the default): the actor's own eager torch call, on
  # views of the variables. A burst updates them in a graph call; the next
  # policy call must see the new values (a stale view would be the old
  # actor), equal to the actor's TF call.
  hyper = agents.Hyper(batch_size=32, lr=0.05)
  buffer = _filled_buffer()
  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, seed=6, hyper=hyper, capacity=buffer.capacity)
  assert agent.policy_call == "torch"
  obs = np.array([0.3, -0.2, 0.5], np.float32)
  before = agent.policy(obs)
  agent.replay.sync_from(buffer)
  agent.train_burst(tf.constant(6))
  after = agent.policy(obs)
  assert not np.allclose(before, after)
  np.testing.assert_allclose(after, agent.actor(tf.constant(obs[None])).numpy()[0], rtol=1e-6)
  # And again after a second burst, with the views lent by the last call.
  agent.train_burst(tf.constant(6))
  np.testing.assert_allclose(
    agent.policy(obs), agent.actor(tf.constant(obs[None])).numpy()[0], rtol=1e-6
  )
  with pytest.raises(ValueError, match="policy_call='torch' is for the torchbridge backend"):
    agents.TFAgent("tf", 3, 1, 2.0, seed=0, hyper=hyper, policy_call="torch")


def test_the_replay_mirror_copies_only_new_rows_and_wraps():
  from td3 import replay  # pylint: disable=import-outside-toplevel

  buffer = replay.ReplayBuffer(3, 1, capacity=8)
  mirror = replay.TFReplay(3, 1, capacity=8)
  for i in range(5):
    buffer.add(np.full(3, i), [i], i, np.full(3, i), False)
  mirror.sync_from(buffer)
  for i in range(5, 11):  # wraps: rows 0..2 now hold 8, 9, 10
    buffer.add(np.full(3, i), [i], i, np.full(3, i), i == 10)
  mirror.sync_from(buffer)
  assert int(mirror.size.numpy()) == 8
  for column_tf, column_np in zip(mirror.columns, buffer.columns()):
    np.testing.assert_array_equal(column_tf.numpy(), column_np)
  np.testing.assert_array_equal(mirror.columns[1].numpy()[:, 0], [8, 9, 10, 3, 4, 5, 6, 7])


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
