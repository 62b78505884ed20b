"""Torch models and small utilities shared by the `tb.TorchModule` tests.

torch is imported before tensorflow, the recommended order (README, "Installs
and import order"; tests/test_installs.py checks the others).
"""

import re

import numpy as np
import pytest
import torch
import tensorflow as tf

# Each TorchModule test that can runs twice: eagerly and inside tf.function.
MODES = ["eager", "function"]


def maybe_function(mode, fn):
  """`fn` itself eagerly, `tf.function(fn)` in graph mode."""
  return fn if mode == "eager" else tf.function(fn)


mode_param = pytest.mark.parametrize("mode", MODES)


class MLP(torch.nn.Module):
  """Linear-tanh-Linear-tanh-Linear."""

  def __init__(self, n_in=4, n_hidden=(16, 8), n_out=2):
    super().__init__()
    sizes = (n_in,) + tuple(n_hidden)
    self.hidden = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
    self.head = torch.nn.Linear(sizes[-1], n_out)

  def forward(self, x):
    for layer in self.hidden:
      x = torch.tanh(layer(x))
    return self.head(x)


class SmallCNN(torch.nn.Module):
  """Conv-relu-Conv-relu-flatten-Linear on NCHW images."""

  def __init__(self, channels=2, size=6, n_out=3):
    super().__init__()
    self.conv1 = torch.nn.Conv2d(channels, 4, 3, padding=1)
    self.conv2 = torch.nn.Conv2d(4, 3, 3)
    self.fc = torch.nn.Linear(3 * (size - 2) * (size - 2), n_out)

  def forward(self, x):
    x = torch.relu(self.conv1(x))
    x = torch.relu(self.conv2(x))
    return self.fc(torch.flatten(x, 1))


class BNNet(torch.nn.Module):
  """Linear-BatchNorm-relu-Linear: a forward that writes buffers."""

  def __init__(self, n_in=3, n_hidden=5, n_out=2, momentum=0.1):
    super().__init__()
    self.l1 = torch.nn.Linear(n_in, n_hidden)
    self.bn = torch.nn.BatchNorm1d(n_hidden, momentum=momentum)
    self.l2 = torch.nn.Linear(n_hidden, n_out)

  def forward(self, x):
    return self.l2(torch.relu(self.bn(self.l1(x))))


def seeded(seed, build, *args, **kwargs):
  """`build(*args, **kwargs)` under `torch.manual_seed(seed)`."""
  torch.manual_seed(seed)
  return build(*args, **kwargs)


def data(shape, seed=0, dtype=np.float32):
  """Deterministic standard-normal values as a numpy array."""
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def values(module_tf):
  """`{variable name: copy of its value}` of a TorchModule's variables."""
  return {v.name: v.numpy().copy() for v in module_tf.variables}


def assert_same_values(before, after):
  assert set(before) == set(after)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def var(module_tf, torch_name):
  """The TorchModule variable of one torch parameter or buffer path."""
  wanted = f"{module_tf.name}/{torch_name}:0"
  found = [v for v in module_tf.variables if v.name == wanted]
  assert len(found) == 1, (wanted, [v.name for v in module_tf.variables])
  return found[0]


def data_ptr(variable):
  """Address of the buffer that holds a TF variable's current value."""
  import torchbridge as tb

  return tb.to_torch(variable).data_ptr()


# ------------------------------------------- checkpoint round trip, shared
# by the test process and the fresh process it starts.

CHECKPOINT_OPTIMIZERS = ("keras_adam", "tf_keras_adam")


def checkpoint_model(opt_name, seed):
  """A TorchModule with buffers (BatchNorm) and an optimizer for it."""
  import tf_keras
  import torchbridge as tb

  actor = tb.TorchModule(seeded(seed, BNNet), name="actor")
  opt = {
    "keras_adam": lambda: tf.keras.optimizers.Adam(0.01),
    "tf_keras_adam": lambda: tf_keras.optimizers.Adam(0.01),
  }[opt_name]()
  return actor, opt


def train_step(actor, opt):
  """A tf.function training step, which also updates the BN statistics."""
  tvars = actor.trainable_variables

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((actor(x, training=True) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))
    return loss

  return step


def checkpoint_probe(actor, opt):
  """Numbers that depend on every parameter, buffer and optimizer slot:
  the eval-mode output (running statistics), then one more training step
  (Adam's moments and step count) and the state it leaves."""
  x, y = tf.constant(data([6, 3], seed=11)), tf.constant(data([6, 2], seed=12))
  result = {"eval_out": actor(x, training=False).numpy()}
  result["loss"] = train_step(actor, opt)(x, y).numpy()
  result["iterations"] = np.array(int(opt.iterations.numpy()))
  for n, w in actor.get_weights().items():
    result[f"after/{n}"] = w
  return result


def lines_before_progress(log):
  """What an example printed before its first progress bar line, less
  TensorFlow's own C++ log lines (absl's notice, `I0000 ...` lines and
  the CPU-feature notice): what torchbridge and torch add to a user's
  terminal on the way to the first step."""
  kept = []
  for line in log.splitlines():
    if line.startswith("[#") or line.startswith("[."):
      break
    if re.match(r"^[IWEF]\d{4} ", line) or line.startswith(
      ("WARNING: All log messages before absl", "To enable the following instructions")
    ):
      continue
    if line.strip():
      kept.append(line)
  return kept
