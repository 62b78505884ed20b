"""torchbridge.ray: weights through the object store, data-parallel training.

One local Ray (2 CPUs) serves the whole module. Actors that import torch and
TF take seconds to start on this machine, so the trainer that the
equivalence tests check is built once (module-scoped fixture). Each test
actor asks for half a CPU, so that the module's up to five live actors all
fit on the 2 CPUs (an actor that does not fit waits for one to end).
"""

import functools
import json
import os
import subprocess
import sys

import torch  # noqa: F401  (before TensorFlow)
import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
TOL = {"rtol": 1e-9, "atol": 1e-9}
HALF_CPU = {"num_cpus": 0.5}


@pytest.fixture(scope="module", autouse=True)
def ray_session():
  """A local Ray with 2 CPUs; functions of this file ship by value."""
  # The workers cannot import this test file by name: pickle its functions
  # (module_fn, loss_fn) by value instead.
  this_module = sys.modules[__name__]
  ray.cloudpickle.register_pickle_by_value(this_module)
  # address="local": a new Ray of our own, even where `ray start` runs one.
  ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
  yield
  ray.shutdown()
  ray.cloudpickle.unregister_pickle_by_value(this_module)


def mlp64():
  return torch.nn.Sequential(
    torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
  ).double()


def mse(module, x, y):
  return tf.reduce_mean((module(x) - y) ** 2)


def _data(n, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4))
  return x, np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], axis=1)


class _PutCounter:
  """Wraps `ray.put` (the function torchbridge.ray calls) and counts calls."""

  def __init__(self, monkeypatch):
    self.refs = []
    real_put = ray.put

    def counting_put(value, *args, **kwargs):
      ref = real_put(value, *args, **kwargs)
      self.refs.append(ref)
      return ref

    monkeypatch.setattr(ray, "put", counting_put)


# --- data-parallel training ----------------------------------------------


@pytest.fixture(scope="module")
def two_worker_run():
  """20 Adam steps on two unequal shards, and the single-process reference."""
  x, y = _data(64, seed=0)
  shards = [(x[:24], y[:24]), (x[24:], y[24:])]  # unequal: weights matter
  trainer = tb.ray.DataParallelTrainer(
    mlp64,
    mse,
    tf.keras.optimizers.Adam(0.01),
    shards,
    num_workers=2,
    name="mlp",
    worker_options=HALF_CPU,
  )
  initial_np = trainer.module.get_weights()
  losses, puts_per_step = [], []
  with pytest.MonkeyPatch.context() as mp:
    counter = _PutCounter(mp)
    for _ in range(20):
      before = len(counter.refs)
      losses.append(trainer.step())
      puts_per_step.append(len(counter.refs) - before)

  # The reference: one process, the concatenated batch, the same optimizer.
  reference = tb.TorchModule(mlp64(), name="mlp")
  reference.set_weights(initial_np)
  opt = tf.keras.optimizers.Adam(0.01)
  x_tf, y_tf = tf.constant(x), tf.constant(y)
  ref_losses = []
  for _ in range(20):
    with tf.GradientTape() as tape:
      loss = mse(reference, x_tf, y_tf)
    grads = tape.gradient(loss, reference.trainable_variables)
    opt.apply_gradients(zip(grads, reference.trainable_variables))
    ref_losses.append(float(loss))
  yield {
    "trainer": trainer,
    "losses": losses,
    "ref_losses": ref_losses,
    "reference": reference,
    "initial": initial_np,
    "puts_per_step": puts_per_step,
    "data": (x, y),
  }
  trainer.shutdown()


def test_two_workers_match_one_process_on_the_concatenated_batch(two_worker_run):
  run = two_worker_run
  trained = run["trainer"].module.get_weights()
  expected = run["reference"].get_weights()
  assert sorted(trained) == ["0.bias", "0.weight", "2.bias", "2.weight"]
  for name, value in expected.items():
    assert trained[name].dtype == np.float64
    assert not np.allclose(value, run["initial"][name])  # it trained
    np.testing.assert_allclose(trained[name], value, **TOL, err_msg=name)
  np.testing.assert_allclose(run["losses"], run["ref_losses"], **TOL)
  assert run["losses"][-1] < 0.75 * run["losses"][0]  # it learned


def test_each_step_broadcasts_with_one_put_and_every_worker_holds_the_weights(two_worker_run):
  trainer = two_worker_run["trainer"]
  assert two_worker_run["puts_per_step"] == [1] * 20  # not one per worker
  driver_np = trainer.module.get_weights()
  for worker in trainer.workers:
    worker_np = tb.ray.pull_weights(worker)
    assert sorted(worker_np) == sorted(driver_np)
    for name, value in driver_np.items():
      np.testing.assert_array_equal(worker_np[name], value)


def test_a_failing_worker_is_named_with_its_error_and_nothing_is_applied(two_worker_run):
  trainer = two_worker_run["trainer"]
  x, y = two_worker_run["data"]
  before = trainer.module.get_weights()
  steps = trainer.steps
  bad = [(x[:8], y[:8]), (x[:8, :3], y[:8])]  # worker 1: 3 features, not 4
  with pytest.raises(RuntimeError) as info:
    trainer.step(batches=bad)
  message = str(info.value)
  assert "worker 1 of 2 failed in compute_gradients()" in message
  assert "must have same reduction dim" in message  # torch's own message
  assert isinstance(info.value.__cause__, ray.exceptions.RayTaskError)
  after = trainer.module.get_weights()
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], value)
  assert trainer.steps == steps
  # The workers are intact: fresh batches of any size work.
  loss = trainer.step(batches=[(x[:8], y[:8]), (x[8:40], y[8:40])])
  assert np.isfinite(loss) and trainer.steps == steps + 1


def test_step_batches_are_weighted_by_their_sample_counts(two_worker_run):
  trainer = two_worker_run["trainer"]
  x, y = two_worker_run["data"]
  weights_np = trainer.module.get_weights()
  local = tb.TorchModule(mlp64(), name="mlp")
  local.set_weights(weights_np)
  expected = float(mse(local, tf.constant(x[:50]), tf.constant(y[:50])))
  # The loss step() reports is the one before its update.
  loss = trainer.step(batches=[(x[:10], y[:10]), (x[10:50], y[10:50])])
  np.testing.assert_allclose(loss, expected, **TOL)


def test_a_loss_that_is_not_scalar_is_reported_from_the_worker():
  x, y = _data(8, seed=1)

  def per_sample_loss(module, x, y):
    return tf.reduce_mean((module(x) - y) ** 2, axis=1)

  with tb.ray.DataParallelTrainer(
    mlp64, per_sample_loss, tf.keras.optimizers.SGD(0.1), [(x, y)], worker_options=HALF_CPU
  ) as trainer:
    with pytest.raises(RuntimeError) as info:
      trainer.step()
  message = str(info.value)
  assert "worker 0 of 1 failed in compute_gradients(): ValueError" in message
  assert "loss_fn must return a scalar floating loss" in message
  assert "shape (8,)" in message
  assert trainer.workers == []
  with pytest.raises(RuntimeError, match=r"after shutdown\(\)"):
    trainer.step()


def bn64():
  return torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)).double()


def test_batch_norm_statistics_are_averaged_over_the_workers():
  x, y = _data(40, seed=2)
  shards = [(x[:10], y[:10]), (x[10:], y[10:])]
  with tb.ray.DataParallelTrainer(
    bn64, mse, tf.keras.optimizers.SGD(0.0), shards, worker_options=HALF_CPU
  ) as trainer:
    trainer.step()
    driver_np = trainer.module.get_weights()
    # Each worker's running mean is 0.1 x its shard's mean (momentum 0.1,
    # from 0); weighted by shard sizes they give 0.1 x the overall mean.
    np.testing.assert_allclose(driver_np["0.running_mean"], 0.1 * x.mean(axis=0), **TOL)
    assert int(driver_np["0.num_batches_tracked"]) == 1
    for worker in trainer.workers:
      worker_np = tb.ray.pull_weights(worker)
      for name, value in driver_np.items():
        np.testing.assert_array_equal(worker_np[name], value)


def mlp64_failing_in_actors():
  if ray.get_runtime_context().get_actor_id() is not None:
    raise RuntimeError("this worker cannot build the model")
  return mlp64()


def test_a_worker_that_cannot_start_is_named_with_its_error():
  x, y = _data(8, seed=1)
  with pytest.raises(RuntimeError) as info:
    tb.ray.DataParallelTrainer(
      mlp64_failing_in_actors, mse, tf.keras.optimizers.SGD(0.1), [(x, y)], worker_options=HALF_CPU
    )
  message = str(info.value)
  assert "worker 0 of 1 failed in set_weights()" in message
  assert "this worker cannot build the model" in message


@pytest.mark.parametrize(
  "shards, match",
  [
    (
      [],
      r"expects a non-empty list with one shard of\ndata per worker, "
      r"got an empty list",
    ),
    (np.zeros((4, 2)), r"got a ndarray"),
    ({"x": np.zeros(3)}, r"got a dict"),
    (
      [(np.zeros((4, 2)), np.zeros((3, 1)))],
      r"shard 0 must be a tuple of arrays sharing a non-zero leading "
      r"\(sample\) dimension, got shapes \[\(4, 2\), \(3, 1\)\]",
    ),
    ([(np.zeros((0, 2)),)], r"shard 0 must be .* got shapes \[\(0, 2\)\]"),
  ],
)
def test_bad_shards_are_refused_before_any_actor_starts(shards, match):
  with pytest.raises(ValueError, match=match):
    tb.ray.DataParallelTrainer(mlp64, mse, tf.keras.optimizers.SGD(0.1), shards)


def test_bad_arguments_name_what_was_expected():
  x, y = _data(8, seed=0)
  shards = [(x[:4], y[:4]), (x[4:], y[4:])]
  sgd = tf.keras.optimizers.SGD(0.1)
  with pytest.raises(
    ValueError, match=(r"num_workers=3\) does not match the 2 shards given.*Pass 3 shards")
  ):
    tb.ray.DataParallelTrainer(mlp64, mse, sgd, shards, num_workers=3)
  with pytest.raises(
    TypeError,
    match=r"module_fn=\.\.\.\) expects a callable, "
    r"got Sequential",
  ):
    tb.ray.DataParallelTrainer(mlp64(), mse, sgd, shards)
  with pytest.raises(TypeError, match=r"loss_fn=\.\.\.\) expects a callable"):
    tb.ray.DataParallelTrainer(mlp64, "mse", sgd, shards)
  with pytest.raises(
    TypeError,
    match=r"expects a TF optimizer .* got str.*"
    r"tf\.keras\.optimizers\.Adam",
  ):
    tb.ray.DataParallelTrainer(mlp64, mse, "adam", shards)
  with pytest.raises(
    TypeError,
    match=r"module_fn\(\) returned a int, "
    r"expected a torch\.nn\.Module",
  ):
    tb.ray.DataParallelTrainer(lambda: 3, mse, sgd, shards)


def test_step_batches_must_match_the_workers(two_worker_run):
  trainer = two_worker_run["trainer"]
  x, y = two_worker_run["data"]
  with pytest.raises(ValueError, match=r"got 1 batches for 2 workers"):
    trainer.step(batches=[(x, y)])
  with pytest.raises(
    ValueError,
    match=r"step\(batches=\.\.\.\) expects a "
    r"non-empty list with one batch",
  ):
    trainer.step(batches=[])


# --- weights through the object store -----------------------------------


def linear_4mb():
  return torch.nn.Linear(1000, 1000)  # 4 MB of float32 weights


@pytest.fixture(scope="module")
def workers():
  worker_cls = ray.remote(tb.ray.TorchModuleWorker).options(**HALF_CPU)
  actors = [worker_cls.remote(linear_4mb, name="lin") for _ in range(2)]
  yield actors
  for actor in actors:
    ray.kill(actor)


def test_broadcast_reaches_every_actor_with_one_put(workers, monkeypatch):
  torch.manual_seed(123)
  learner = tb.TorchModule(linear_4mb(), name="lin")
  counter = _PutCounter(monkeypatch)
  refs = tb.ray.broadcast_weights(learner, workers)
  assert len(counter.refs) == 1
  assert ray.get(refs) == [None, None]
  learner_np = learner.get_weights()
  for actor in workers:
    actor_np = tb.ray.pull_weights(actor)
    assert sorted(actor_np) == ["bias", "weight"]
    for name, value in learner_np.items():
      assert actor_np[name].dtype == value.dtype
      np.testing.assert_array_equal(actor_np[name], value)


def test_broadcast_hands_every_actor_the_same_object_ref(monkeypatch):

  class RecordingActor:
    """Duck-types an actor handle, recording what set_weights was sent."""

    def __init__(self):
      self.sent = []
      self.set_weights = self

    def remote(self, arg):
      self.sent.append(arg)
      return "call-ref"

  counter = _PutCounter(monkeypatch)
  actors = [RecordingActor() for _ in range(3)]
  module = tb.TorchModule(torch.nn.Linear(3, 2))
  assert tb.ray.broadcast_weights(module, actors) == ["call-ref"] * 3
  [put_ref] = counter.refs
  assert all(a.sent == [put_ref] for a in actors)
  assert isinstance(put_ref, ray.ObjectRef)
  stored = ray.get(put_ref)
  for name, value in module.get_weights().items():
    np.testing.assert_array_equal(stored[name], value)
  assert tb.ray.broadcast_weights(module, []) == []
  assert len(counter.refs) == 1  # nothing to send, nothing put


def test_read_only_arrays_from_the_object_store_load_and_stay_untouched():
  module = tb.TorchModule(torch.nn.Linear(3, 2), name="lin")
  weights_np = {k: v + 1.0 for k, v in module.get_weights().items()}
  ref = tb.ray.put_weights(weights_np)
  fetched = ray.get(ref)
  assert not fetched["weight"].flags.writeable  # a zero-copy view
  worker = tb.ray.TorchModuleWorker(functools.partial(torch.nn.Linear, 3, 2), name="lin")
  worker.set_weights(ref)  # an ObjectRef ...
  worker.set_weights(fetched)  # ... or the read-only arrays themselves
  np.testing.assert_array_equal(worker.get_weights()["weight"], weights_np["weight"])
  # Training the worker's module updates its variables, not the arrays.
  opt = tf.keras.optimizers.SGD(0.5)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(worker.module(tf.ones([2, 3])) ** 2)
  variables = worker.module.trainable_variables
  opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
  assert not np.array_equal(worker.get_weights()["weight"], weights_np["weight"])
  np.testing.assert_array_equal(fetched["weight"], weights_np["weight"])


def test_actor_set_weights_takes_a_dict_or_a_ref_and_pull_loads_a_module(workers):
  weights_np = {
    "weight": np.full((1000, 1000), 0.5, np.float32),
    "bias": np.arange(1000, dtype=np.float32),
  }
  ray.get(workers[0].set_weights.remote(weights_np))  # by value
  ray.get(workers[1].set_weights.remote(tb.ray.put_weights(weights_np)))
  local = tb.TorchModule(linear_4mb(), name="lin")
  for actor in workers:
    pulled = tb.ray.pull_weights(actor, local)
    np.testing.assert_array_equal(pulled["bias"], weights_np["bias"])
    np.testing.assert_array_equal(local.get_weights()["weight"], weights_np["weight"])


def test_actor_set_weights_errors_arrive_with_the_names(workers):
  with pytest.raises(ray.exceptions.RayTaskError) as info:
    ray.get(workers[0].set_weights.remote({"weight": np.zeros((2, 2))}))
  assert isinstance(info.value, ValueError)  # Ray keeps the type
  message = str(info.value)
  assert "missing names: ['bias']" in message
  assert "'weight' has shape (2, 2), expected (1000, 1000)" in message


def test_weight_helpers_refuse_what_is_not_a_module_or_an_actor():
  with pytest.raises(
    TypeError,
    match=r"put_weights\(module\) expects a "
    r"tb\.TorchModule .* got int",
  ):
    tb.ray.put_weights(42)
  module = tb.TorchModule(torch.nn.Linear(3, 2))
  with pytest.raises(
    TypeError,
    match=r"broadcast_weights\(\): actors\[1\] is "
    r"a object, which has no `set_weights`",
  ):
    tb.ray.broadcast_weights(module, [_FakeActor(), object()])
  with pytest.raises(
    TypeError,
    match=r"(?s)pull_weights\(\): actor is a str, "
    r"which has no `get_weights`.*ray\.remote",
  ):
    tb.ray.pull_weights("actor")
  with pytest.raises(
    TypeError,
    match=r"module_fn\) expects a callable .* got "
    r"Linear.*lambda: MyNet\(\)",
  ):
    tb.ray.TorchModuleWorker(torch.nn.Linear(3, 2))
  with pytest.raises(
    TypeError,
    match=r"module_fn\(\) returned a str, expected "
    r"a torch\.nn\.Module",
  ):
    tb.ray.TorchModuleWorker(lambda: "net")


class _FakeActor:
  set_weights = None


# --- packaging ------------------------------------------------------------


def test_torchbridge_never_imports_ray_and_a_missing_ray_names_the_fix():
  code = (
    "import sys\n"
    "import torchbridge as tb\n"
    "assert 'ray' not in sys.modules, 'import torchbridge imported ray'\n"
    "sys.modules['ray'] = None  # as if Ray were not installed\n"
    "try:\n"
    "  tb.ray\n"
    "except ImportError as err:\n"
    "  print(err)\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "torchbridge.ray needs Ray" in out.stdout
  assert "pip install ray" in out.stdout


# --- examples ---------------------------------------------------------------


def _run_example(script, *args):
  # A fresh process with its own local Ray, as a user would run it.
  out = subprocess.run(
    [sys.executable, os.path.join(EXAMPLES, script), *args],
    capture_output=True,
    text=True,
    timeout=240,
    cwd=ROOT,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def test_td3_rollout_worker_example_runs_a_short_budget(tmp_path):
  stdout = _run_example(
    "td3_ray.py",
    "--workers",
    "2",
    "--steps",
    "400",
    "--start-steps",
    "200",
    "--push-every",
    "100",
    "--eval-every",
    "400",
    "--eval-episodes",
    "1",
    "--out",
    str(tmp_path),
  )
  with open(tmp_path / "results.json") as f:
    results = json.load(f)
  assert results["steps"] == 400 and results["workers"] == 2
  assert results["train_steps"] == 200  # one per step after start-steps
  assert results["pushes"] == 3  # the initial push, then after each round
  assert results["episodes"] == 2  # Pendulum episodes last 200 steps
  assert results["workers_hold_learner_weights"] is True
  [[step, eval_return]] = results["eval_returns"]
  assert step == 400 and -2000 < eval_return <= 0
  assert "workers hold the learner's weights: True" in stdout


def test_data_parallel_example_learns(tmp_path):
  stdout = _run_example(
    "ray_data_parallel.py",
    "--workers",
    "2",
    "--steps",
    "60",
    "--samples",
    "1024",
    "--out",
    str(tmp_path),
  )
  with open(tmp_path / "results.json") as f:
    results = json.load(f)
  assert results["final_loss"] < 0.5 * results["first_loss"]
  assert results["test_mse"] < 0.5 * results["test_mse_predicting_mean"]
  assert results["workers_hold_driver_weights"] is True
  assert "workers hold the driver's weights: True" in stdout
