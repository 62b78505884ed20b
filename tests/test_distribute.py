"""TorchModule and TorchLayer under tf.distribute.

Two replicas on two logical CPU devices (set up in conftest.py): each runs
its own torch forward and backward on its shard, TF all-reduces the
gradients, and the result must equal single-process training on the whole
batch (float64, 1e-9).
"""

import copy

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

GLOBAL_BATCH = 8
STEPS = 20


@pytest.fixture(scope="module")
def strategy():
  # One strategy for the module: TF numbers the collective ops of each
  # strategy from the same start, so two strategies' ops in one process can
  # meet in one collective instance.
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _mlp(seed=0):
  torch.manual_seed(seed)
  return torch.nn.Sequential(
    torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
  ).double()


def _data(seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(GLOBAL_BATCH, 3)), rng.normal(size=(GLOBAL_BATCH, 2))


def _shards(strategy, array):
  """The array split across the replicas, replica k getting the k-th part."""
  n = strategy.num_replicas_in_sync
  per_replica = len(array) // n

  def shard(ctx):
    k = ctx.replica_id_in_sync_group
    return tf.constant(array[k * per_replica : (k + 1) * per_replica])

  return strategy.experimental_distribute_values_from_function(shard)


def _loss(module, x, y, training=None):
  # Scaled by the global batch: the replicas' gradients sum to the gradient
  # of the mean loss over the whole batch.
  return tf.reduce_sum((module(x, training=training) - y) ** 2) / GLOBAL_BATCH


def _train_single(net, x, y, steps, in_mode, optimizer=tf.keras.optimizers.Adam):
  module = tb.TorchModule(net, name="net")
  opt = optimizer(0.01)
  opt.build(module.trainable_variables)

  def step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      loss = _loss(module, x_tf, y_tf)
    grads = tape.gradient(loss, module.trainable_variables)
    opt.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  step = in_mode(step)
  for _ in range(steps):
    step(tf.constant(x), tf.constant(y))
  return module


def _train_mirrored(
  strategy, net, x, y, steps, in_mode, training=None, optimizer=tf.keras.optimizers.Adam
):
  with strategy.scope():
    module = tb.TorchModule(net, name="net")
    opt = optimizer(0.01)
    # Keras optimizers must create their slots before a tf.function runs
    # them under a strategy (true of native variables too).
    opt.build(module.trainable_variables)

  def replica_step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      loss = _loss(module, x_tf, y_tf, training)
    grads = tape.gradient(loss, module.trainable_variables)
    opt.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  step = in_mode(lambda x_tf, y_tf: strategy.run(replica_step, (x_tf, y_tf)))
  x_dist, y_dist = _shards(strategy, x), _shards(strategy, y)
  losses = []
  for _ in range(steps):
    losses.append(strategy.reduce("SUM", step(x_dist, y_dist), axis=None))
  return module, losses


def _assert_replicas_equal(module):
  for var in module.variables:
    first, second = (v.numpy() for v in var.values)
    np.testing.assert_array_equal(first, second, err_msg=var.name)


def test_variables_are_mirrored(strategy):
  with strategy.scope():
    module = tb.TorchModule(_mlp(), name="net")
  assert len(module.trainable_variables) == 4
  for var in module.variables:
    assert isinstance(var, tf.distribute.DistributedValues), var
    assert [v.device for v in var.values] == [
      "/job:localhost/replica:0/task:0/device:CPU:0",
      "/job:localhost/replica:0/task:0/device:CPU:1",
    ]
  _assert_replicas_equal(module)


def test_two_replicas_match_single_process(strategy, in_mode):
  x, y = _data()
  net = _mlp()
  reference = _train_single(copy.deepcopy(net), x, y, STEPS, in_mode)
  mirrored, losses = _train_mirrored(strategy, net, x, y, STEPS, in_mode)

  _assert_replicas_equal(mirrored)
  expected = reference.get_weights()
  for name, value in mirrored.get_weights().items():
    np.testing.assert_allclose(value, expected[name], rtol=1e-9, atol=1e-9, err_msg=name)
  # It trained: the weights moved and the loss fell.
  initial = tb.TorchModule(_mlp(), name="init").get_weights()
  assert not np.allclose(expected["0.weight"], initial["0.weight"])
  assert float(losses[-1]) < float(losses[0])


def test_each_replica_runs_torch_on_its_own_shard(strategy, in_mode):
  x, y = _data()
  net = _mlp()
  seen = []  # (batch size, first row) of each real torch forward

  def record(module, inputs):
    del module
    if not inputs[0].is_meta:  # tracing runs the forward on meta tensors
      seen.append((inputs[0].shape[0], tuple(inputs[0][0].tolist())))

  net.register_forward_pre_hook(record)
  _train_mirrored(strategy, net, x, y, 2, in_mode)
  assert len(seen) == 4  # 2 steps x 2 replicas
  assert {size for size, _ in seen} == {GLOBAL_BATCH // 2}
  assert {row for _, row in seen} == {tuple(x[0]), tuple(x[GLOBAL_BATCH // 2])}


def test_sgd_matches_single_process(strategy):
  # A second optimizer, eagerly: SGD applies the all-reduced gradient as is.
  x, y = _data(seed=3)
  net = _mlp(seed=3)
  in_mode = lambda fn: fn  # noqa: E731
  reference = _train_single(copy.deepcopy(net), x, y, 5, in_mode, optimizer=tf.keras.optimizers.SGD)
  mirrored, _ = _train_mirrored(strategy, net, x, y, 5, in_mode, optimizer=tf.keras.optimizers.SGD)
  expected = reference.get_weights()
  for name, value in mirrored.get_weights().items():
    np.testing.assert_allclose(value, expected[name], rtol=1e-9, atol=1e-9)


def test_buffers_written_by_replicas_stay_in_sync(strategy, in_mode):
  torch.manual_seed(1)
  net = torch.nn.Sequential(
    torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
  ).double()
  x, y = _data(seed=1)
  steps = 3
  mirrored, _ = _train_mirrored(strategy, copy.deepcopy(net), x, y, steps, in_mode, training=True)
  _assert_replicas_equal(mirrored)
  # Integer counters take the first replica's value: one per step.
  assert mirrored.get_weights()["1.num_batches_tracked"] == steps

  # Floating buffers take the replicas' mean: for equal shards, the mean of
  # the shards' running-mean updates is the whole batch's update.
  one_step, _ = _train_mirrored(strategy, copy.deepcopy(net), x, y, 1, in_mode, training=True)
  _assert_replicas_equal(one_step)
  with torch.no_grad():
    batch_mean = net[0](torch.from_numpy(x)).mean(0).numpy()
  momentum = net[1].momentum
  expected = (1 - momentum) * net[1].running_mean.numpy() + momentum * batch_mean
  np.testing.assert_allclose(
    one_step.get_weights()["1.running_mean"], expected, rtol=1e-9, atol=1e-12
  )


class _ReplicaStamp(torch.nn.Module):
  """Writes its shard's first value into an integer and a float buffer."""

  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 2).double()
    self.register_buffer("stamp", torch.zeros(1, dtype=torch.int64))
    self.register_buffer("stamp_float", torch.zeros(1, dtype=torch.float64))

  def forward(self, x):
    with torch.no_grad():
      self.stamp.copy_(x[:1, 0].to(torch.int64))
      self.stamp_float.copy_(x[:1, 0])
    return self.lin(x)


def test_integer_buffers_take_the_first_replica_and_floats_the_mean(strategy, in_mode):
  # Replica 0 writes 10 and replica 1 writes 30: the first replica's value
  # (10) and the mean (20) differ, so the test tells the two rules apart.
  x = np.zeros((GLOBAL_BATCH, 3))
  x[0, 0], x[GLOBAL_BATCH // 2, 0] = 10.0, 30.0
  with strategy.scope():
    module = tb.TorchModule(_ReplicaStamp(), name="stamp")
  step = in_mode(
    lambda x_tf: strategy.run(lambda x_replica: module(x_replica, training=True), (x_tf,))
  )
  step(_shards(strategy, x))
  _assert_replicas_equal(module)
  weights = module.get_weights()
  # Documented: integer buffers take the first replica's value, floating
  # buffers the mean.
  np.testing.assert_array_equal(weights["stamp"], [10])
  np.testing.assert_array_equal(weights["stamp_float"], [20.0])


def test_checkpoint_moves_between_mirrored_and_plain(strategy, tmp_path):
  x, y = _data()
  trained, _ = _train_mirrored(strategy, _mlp(), x, y, 3, lambda fn: fn)
  path = tf.train.Checkpoint(net=trained).write(str(tmp_path / "ckpt"))

  plain = tb.TorchModule(_mlp(seed=5), name="net")
  tf.train.Checkpoint(net=plain).read(path).assert_consumed()
  expected = trained.get_weights()
  for name, value in plain.get_weights().items():
    np.testing.assert_array_equal(value, expected[name])

  with strategy.scope():
    restored = tb.TorchModule(_mlp(seed=6), name="net")
  tf.train.Checkpoint(net=restored).read(path).assert_consumed()
  _assert_replicas_equal(restored)
  for name, value in restored.get_weights().items():
    np.testing.assert_array_equal(value, expected[name])


def test_module_made_outside_the_scope_is_refused_in_a_replica(strategy):
  module = tb.TorchModule(_mlp(), name="outside")
  x_dist = _shards(strategy, _data()[0])
  with pytest.raises(ValueError) as info:
    strategy.run(module, (x_dist,))
  message = str(info.value)
  assert "module 'outside' was created outside `strategy.scope()`" in message
  assert "MirroredStrategy" in message
  assert "with strategy.scope():" in message
  # Outside strategy.run (cross-replica context) it still works.
  with strategy.scope():
    assert module(tf.constant(_data()[0])).shape == (GLOBAL_BATCH, 2)


def test_unsupported_strategy_is_refused_with_the_fix():
  central = tf.distribute.experimental.CentralStorageStrategy()
  with central.scope():
    with pytest.raises(ValueError) as info:
      tb.TorchModule(_mlp(), name="net")
  message = str(info.value)
  assert "TorchModule 'net' cannot run under CentralStorageStrategy" in message
  assert "MirroredStrategy" in message and "strategy.scope()" in message

  module = tb.TorchModule(_mlp(), name="net")
  with central.scope():
    with pytest.raises(ValueError, match="cannot run under CentralStorage"):
      module(tf.constant(_data()[0]))

  with central.scope():
    with pytest.raises(ValueError, match="layer cannot run under CentralStorageStrategy"):
      tb.keras.TorchLayer(_mlp(), name="layer")


@pytest.mark.parametrize(
  "real_strategy, reason",
  [
    (tf.distribute.TPUStrategy, "a TPU cannot run the bridge's XLA custom call"),
    (tf.distribute.experimental.ParameterServerStrategy, "remote worker processes"),
  ],
  ids=["tpu", "parameter_server"],
)
def test_tpu_and_parameter_server_strategies_are_refused(real_strategy, reason):
  # README: TPUStrategy and ParameterServerStrategy are refused with an
  # error saying why. Neither can be made here (no TPU, no cluster), so a
  # stand-in carries the real class's name (which the check reads) and
  # nothing else of it: the real classes are none of the supported ones.
  assert not issubclass(
    real_strategy,
    (
      tf.distribute.MirroredStrategy,
      tf.distribute.MultiWorkerMirroredStrategy,
      tf.distribute.OneDeviceStrategy,
    ),
  )
  stand_in = type(
    real_strategy.__name__, (tf.distribute.experimental.CentralStorageStrategy,), {}
  )()
  with stand_in.scope():
    with pytest.raises(ValueError) as info:
      tb.TorchModule(_mlp(), name="net")
  message = str(info.value)
  assert f"TorchModule 'net' cannot run under {real_strategy.__name__}:" in message
  assert reason in message
  assert "MirroredStrategy" in message and "strategy.scope()" in message
  with stand_in.scope():
    with pytest.raises(ValueError, match=reason):
      tb.keras.TorchLayer(_mlp(), name="layer")


def test_keras_fit_under_mirrored_strategy_matches_single_process(strategy):
  import keras

  x, y = _data(seed=2)
  net = _mlp(seed=2)

  def fit(module):
    model = keras.Sequential(
      [keras.Input((3,), dtype="float64"), tb.keras.TorchLayer(module, name="torch")]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=10, shuffle=False, verbose=0)
    return model

  reference = fit(copy.deepcopy(net))
  with strategy.scope():
    mirrored = fit(net)
  for ref, got in zip(reference.weights, mirrored.weights):
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-9, atol=1e-9, err_msg=got.path)
  assert not np.allclose(reference.weights[0].numpy(), _mlp(seed=2)[0].weight.detach().numpy())


@pytest.mark.slow  # an example, in its own process: make test-long
def test_distributed_training_example_runs_and_learns():
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
    [
      sys.executable,
      os.path.join(root, "examples", "distributed_training.py"),
      "--replicas",
      "2",
      "--steps",
      "200",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "MirroredStrategy with 2 replicas" in out.stdout
  losses = [
    float(line.split("loss ")[1].split()[0])
    for line in out.stdout.splitlines()
    if line.startswith("step")
  ]
  assert len(losses) == 2 and losses[-1] < losses[0]


def test_torch_function_runs_per_replica_with_gradients(strategy, in_mode):
  cube = tb.torch_function(lambda t: t**3, name="cube")
  x = np.arange(GLOBAL_BATCH, dtype=np.float64).reshape(GLOBAL_BATCH, 1)

  devices = []  # where each replica's torch call runs (in the graph, when
  # traced: a tf.function returns every result on CPU:0)

  def replica_fn(x_tf):
    with tf.GradientTape() as tape:
      tape.watch(x_tf)
      y_tf = cube(x_tf)
    devices.append(y_tf.device)
    return y_tf, tape.gradient(y_tf, x_tf)

  run = in_mode(lambda x_tf: strategy.run(replica_fn, (x_tf,)))
  y_dist, grad_dist = run(_shards(strategy, x))
  y = np.concatenate([v.numpy() for v in strategy.experimental_local_results(y_dist)])
  grad = np.concatenate([v.numpy() for v in strategy.experimental_local_results(grad_dist)])
  np.testing.assert_array_equal(y, x**3)
  np.testing.assert_array_equal(grad, 3 * x**2)
  assert [d.split(":")[-2:] for d in devices] == [["CPU", "0"], ["CPU", "1"]]


def test_run_tf_in_a_replica_of_several_raises_and_auto_runs_torch(strategy):
  # run="tf" is the translation or an error: a replica of several gets
  # neither runner, so it is an error naming the fix, never torch silently.
  x_dist = _shards(strategy, _data()[0])
  with strategy.scope():
    strict = tb.TorchModule(_mlp(), name="strict", run="tf")
    auto = tb.TorchModule(_mlp(), name="auto_net", run="auto")
  with pytest.raises(ValueError) as info:
    strategy.run(tf.function(strict), (x_dist,))
  message = str(info.value)
  assert 'strict (run="tf")' in message and 'use run="auto"' in message
  out = strategy.run(tf.function(auto), (x_dist,))
  expected = _mlp()(torch.from_numpy(_data()[0])).detach().numpy()
  got = np.concatenate([t.numpy() for t in strategy.experimental_local_results(out)])
  np.testing.assert_allclose(got, expected, rtol=1e-12)
