"""Faults in the middle of a bridged training step (issue 28).

An exception at each stage of a training step (inside the torch forward,
inside the torch backward, while the outputs cross back to TF, in a Keras
callback, and a KeyboardInterrupt inside the forward or between the gradient
and the optimizer step) leaves:
- every variable, optimizer slot and buffer as a reference model interrupted
  at the same point holds it: untouched where the step had not got to it,
  written whole where it had (a bridged forward is all or nothing: its
  buffer updates reach the variables only when it returns);
- the torch module holding its own tensors with the variables' values, not
  what a call swaps in or leaves between calls;
- no lock or thread held: the next step, run on another thread, finishes in
  time;
- and the step retried: the run then equals, bit for bit, one that never
  failed (and did the same completed part of the failed step).

Eagerly and inside `tf.function`; on whichever path this process calls
torch through (the native op, or `tf.py_function` with
TORCHBRIDGE_DISABLE_NATIVE=1: CI runs the suite once on each), and the graph
cases once more in a child process on the other path.
"""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
import keras
import tensorflow as tf

import torchbridge as tb
from torchbridge.keras import TorchLayer
from _fault_helpers import assert_bitwise_equal
from _fault_helpers import assert_torch_module_is_real
from _fault_helpers import fresh_values
from _fault_helpers import optimizer_values
from _fault_helpers import run_in_thread
from _fault_helpers import variable_values

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


class InjectedFault(Exception):
  pass


class _FaultPoint(torch.autograd.Function):
  """The identity, whose backward raises when its net is told to."""

  @staticmethod
  def forward(ctx, x, net):  # pylint: disable=arguments-differ
    ctx.net = net
    return x.clone()

  @staticmethod
  def backward(ctx, dy):  # pylint: disable=arguments-differ
    if ctx.net.fault == "backward":
      raise InjectedFault("the torch backward gave up")
    return dy, None


class FaultNet(nn.Module):
  """Two Linear-BatchNorm-tanh blocks and a head; fails where `fault` says,
  after both BatchNorms have updated their (torch-side) statistics."""

  def __init__(self):
    super().__init__()
    self.l1 = nn.Linear(3, 6)
    self.bn1 = nn.BatchNorm1d(6)
    self.l2 = nn.Linear(6, 6)
    self.bn2 = nn.BatchNorm1d(6)
    self.head = nn.Linear(6, 2)
    self.fault = None

  def forward(self, x):
    h = torch.tanh(self.bn1(self.l1(x)))
    h = torch.tanh(self.bn2(self.l2(h)))
    real = not x.is_meta  # not the shape inference while tracing
    if real and self.fault == "forward":
      raise InjectedFault("the torch forward gave up")
    if real and self.fault == "interrupt_forward":
      raise KeyboardInterrupt()  # as Ctrl-C lands in Python code
    y = _FaultPoint.apply(self.head(h), self)
    if real and self.fault == "export_type":
      return "not a tensor"
    if real and self.fault == "export_shape":
      return torch.cat([y, y[:1]])  # not the traced shape
    return y


# stage -> whether the forward completed (its buffer updates are then in the
# variables, as in a torch or Keras model that got that far).
STAGES = {
  "forward": False,
  "interrupt_forward": False,
  "export_type": False,
  "export_shape": False,
  "backward": True,
  "interrupt_step": True,
}

# What reaches the caller: eagerly the exception itself; from a graph, the
# TF error carrying the torch exception's type and message.
EAGER_ERRORS = {
  "forward": (InjectedFault, "the torch forward gave up"),
  "interrupt_forward": (KeyboardInterrupt, None),
  "export_type": (TypeError, r"returned a str \('not a tensor'\)"),
  "backward": (InjectedFault, "the torch backward gave up"),
  "interrupt_step": (KeyboardInterrupt, None),
}
GRAPH_ERRORS = {
  "forward": (tf.errors.UnknownError, "InjectedFault: the torch forward"),
  "interrupt_forward": (tf.errors.UnknownError, "KeyboardInterrupt"),
  "export_type": (tf.errors.InvalidArgumentError, r"returned a str \('not a tensor'\)"),
  "export_shape": (tf.errors.InvalidArgumentError, r"output 0 has shape \(9, 2\), but \(8, 2\)"),
  "backward": (tf.errors.UnknownError, "InjectedFault: the torch backward"),
  "interrupt_step": (KeyboardInterrupt, None),
}

# An eager call checks no declared shape: a changed one is no fault there.
CASES = [
  (stage, mode)
  for stage in STAGES
  for mode in ("eager", "function")
  if not (stage == "export_shape" and mode == "eager")
]


def _maybe_function(mode, fn):
  return fn if mode == "eager" else tf.function(fn)


class Trainer:
  """A TorchModule around a FaultNet, an Adam optimizer, and a step."""

  def __init__(self, mode, seed=0):
    torch.manual_seed(seed)
    self.net = FaultNet().double()
    self.twin = copy.deepcopy(self.net)  # pure torch, for the buffers
    self.originals = dict(self.net.named_parameters())
    self.originals.update(self.net.named_buffers())
    self.actor = tb.TorchModule(self.net, name="actor")
    self.opt = keras.optimizers.Adam(0.01)
    tvars = self.actor.trainable_variables
    self.opt.build(tvars)  # its slots exist before any fault

    def gradients(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((self.actor(x, training=True) - y) ** 2)
      return loss, tape.gradient(loss, tvars)

    def apply(grads):
      self.opt.apply_gradients(zip(grads, tvars))

    def step(x, y):
      loss, grads = gradients(x, y)
      # In a graph TF runs ops in data-dependency order only: a Keras
      # optimizer's `iterations.assign_add` depends on no gradient and
      # would run even when the forward fails (pure Keras does the same).
      # This makes the optimizer step wait for the gradients.
      with tf.control_dependencies(grads):
        apply(grads)
      return loss

    self._step = _maybe_function(mode, step)
    self._gradients = _maybe_function(mode, gradients)
    self._apply = _maybe_function(mode, apply)

  def step(self, x, y, interrupt=False):
    if not interrupt:
      return self._step(x, y)
    _, grads = self._gradients(x, y)
    raise KeyboardInterrupt()  # Ctrl-C between the gradient and the update

  def forward_only(self, x):
    """A forward's buffer updates alone, as a failed step that got past
    the forward leaves them."""
    self.actor(x, training=True)

  def state(self):
    return {
      "variables": variable_values(self.actor.variables),
      "optimizer": optimizer_values(self.opt),
    }

  def twin_forward_buffers(self, x):
    """The buffers a pure torch forward leaves, from the current values."""
    self.twin.load_state_dict({n: torch.from_numpy(w) for n, w in self.actor.get_weights().items()})
    with torch.no_grad():
      self.twin.train()(torch.from_numpy(x.numpy()))
    return {n: b.numpy().copy() for n, b in self.twin.named_buffers()}


def _batches(n):
  return [
    (fresh_values([8, 3], seed=2 * k), fresh_values([8, 2], seed=2 * k + 1)) for k in range(n)
  ]


def _assert_state(got, want, what):
  assert_bitwise_equal(got["variables"], want["variables"], what + " variables")
  assert_bitwise_equal(got["optimizer"], want["optimizer"], what + " optimizer")


@pytest.mark.parametrize("stage,mode", CASES)
def test_fault_mid_step_loses_nothing_and_retry_equals_undisturbed_run(stage, mode):
  batches = _batches(4)
  faulty = Trainer(mode)
  for x, y in batches[:2]:
    faulty.step(x, y)
  before = faulty.state()
  x, y = batches[2]
  want_buffers = faulty.twin_forward_buffers(x)

  faulty.net.fault = stage
  error, message = (EAGER_ERRORS if mode == "eager" else GRAPH_ERRORS)[stage]
  with pytest.raises(error, match=message):
    faulty.step(x, y, interrupt=stage == "interrupt_step")
  faulty.net.fault = None

  # Parameters and every optimizer variable (iterations, Adam's moments) as
  # before the step; the buffers untouched, or written whole, as a pure
  # torch forward writes them, where the forward completed.
  after = faulty.state()
  assert_bitwise_equal(after["optimizer"], before["optimizer"], "optimizer")
  weights = faulty.actor.get_weights()
  buffer_names = [n for n, _ in faulty.net.named_buffers()]
  for n, v in before["variables"].items():
    torch_name = n.split(":", 1)[1][: -len(":0")]
    if torch_name in buffer_names and STAGES[stage]:
      assert_bitwise_equal({n: weights[torch_name]}, {n: want_buffers[torch_name]}, "buffer")
      assert not np.array_equal(v, want_buffers[torch_name]), torch_name
    else:
      assert_bitwise_equal({n: after["variables"][n]}, {n: v}, "untouched")
  assert int(weights["bn1.num_batches_tracked"]) == 2 + STAGES[stage]
  assert_torch_module_is_real(faulty.net, weights, faulty.originals)
  assert all(m.training for m in faulty.net.modules())  # modes restored

  # The retried step, on another thread (a lock the failed call kept would
  # make it wait forever), then one more.
  run_in_thread(lambda: faulty.step(x, y))
  faulty.step(*batches[3])

  # The same run without the fault (and with the completed part of the
  # failed step, a forward, where it got that far).
  undisturbed = Trainer(mode)
  for x_k, y_k in batches[:2]:
    undisturbed.step(x_k, y_k)
  if STAGES[stage]:
    undisturbed.forward_only(x)
  for x_k, y_k in batches[2:]:
    undisturbed.step(x_k, y_k)
  _assert_state(faulty.state(), undisturbed.state(), "after the retry")
  assert int(faulty.opt.iterations.numpy()) == 4
  assert_torch_module_is_real(faulty.net, faulty.actor.get_weights(), faulty.originals)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_interrupted_forward_leaves_no_buffer_half_written(mode):
  # Two BatchNorms have run when the forward fails: a torch module would
  # keep their new statistics (written in place as it goes); the bridged
  # forward hands its writes to TF only when it returns, so none lands.
  trainer = Trainer(mode)
  x, y = _batches(1)[0]
  trainer.step(x, y)
  before = trainer.actor.get_weights()
  trainer.net.fault = "forward"
  call = _maybe_function(mode, lambda x: trainer.actor(x, training=True))
  with pytest.raises((InjectedFault, tf.errors.UnknownError)):
    call(x)
  trainer.net.fault = None
  assert_bitwise_equal(trainer.actor.get_weights(), before, "after the fault")
  # Torch itself, run the same way, did write them before failing.
  trainer.twin.load_state_dict({n: torch.from_numpy(w) for n, w in before.items()})
  trainer.twin.fault = "forward"
  with pytest.raises(InjectedFault):
    trainer.twin.train()(torch.from_numpy(x.numpy()))
  assert not torch.equal(
    trainer.twin.bn1.running_mean, torch.from_numpy(before["bn1.running_mean"])
  )


# ------------------------------------------------------------ Keras' fit


class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.l1 = nn.Linear(3, 8)
    self.l2 = nn.Linear(8, 2)

  def forward(self, x):
    return self.l2(torch.tanh(self.l1(x)))


class FailAtBatch(keras.callbacks.Callback):
  """Raises in `on_train_batch_{where}` of one batch."""

  def __init__(self, batch, where):
    super().__init__()
    self.batch = batch
    self.where = where

  def on_train_batch_begin(self, batch, logs=None):
    if self.where == "begin" and batch == self.batch:
      raise InjectedFault(f"callback begin of batch {batch}")

  def on_train_batch_end(self, batch, logs=None):
    if self.where == "end" and batch == self.batch:
      raise InjectedFault(f"callback end of batch {batch}")


def _torch_model(seed, run_eagerly):
  torch.manual_seed(seed)
  net = MLP().double()
  originals = dict(net.named_parameters())
  layer = TorchLayer(net, name="mlp")
  model = keras.Sequential([keras.Input((3,), dtype="float64"), layer])
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", run_eagerly=run_eagerly)
  return model, layer, net, originals


def _keras_twin(layer, run_eagerly):
  """The same MLP in Keras layers, from the TorchLayer's values."""
  model = keras.Sequential(
    [
      keras.Input((3,), dtype="float64"),
      keras.layers.Dense(8, activation="tanh", dtype="float64"),
      keras.layers.Dense(2, dtype="float64"),
    ]
  )
  weights = layer.get_weights_by_name()
  model.set_weights(
    [weights["l1.weight"].T, weights["l1.bias"], weights["l2.weight"].T, weights["l2.bias"]]
  )
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", run_eagerly=run_eagerly)
  return model


def _fit_data():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((40, 3))
  return x, np.sin(x[:, :2]) + 0.1 * x[:, 2:]


def _model_state(model):
  return {
    "variables": variable_values(model.weights),
    "optimizer": optimizer_values(model.optimizer),
  }


@pytest.mark.parametrize("where", ["begin", "end"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_exception_in_keras_callback_stops_fit_at_a_whole_step(mode, where):
  run_eagerly = mode == "eager"
  x, y = _fit_data()
  fit = dict(batch_size=8, epochs=1, shuffle=False, verbose=0)
  model, layer, net, originals = _torch_model(0, run_eagerly)
  twin = _keras_twin(layer, run_eagerly)
  steps_done = 2 if where == "begin" else 3  # of 5 batches
  for m in (model, twin):
    with pytest.raises(InjectedFault, match=f"callback {where}"):
      m.fit(x, y, callbacks=[FailAtBatch(2, where)], **fit)
    assert int(m.optimizer.iterations.numpy()) == steps_done

  # As a run of exactly those steps, bit for bit, and as Keras' own layers
  # interrupted at the same batch, to rounding.
  model_ref, _, _, _ = _torch_model(0, run_eagerly)
  model_ref.fit(x[: 8 * steps_done], y[: 8 * steps_done], **fit)
  got = _model_state(model)
  assert_bitwise_equal(got["variables"], _model_state(model_ref)["variables"])
  assert_bitwise_equal(got["optimizer"], _model_state(model_ref)["optimizer"])
  for w, w_twin in zip(layer.get_weights_by_name().values(), [v.T for v in twin.get_weights()]):
    np.testing.assert_allclose(w, w_twin, rtol=1e-10, atol=1e-12)
  assert_torch_module_is_real(net, layer.get_weights_by_name(), originals)

  # The rest of the epoch (on another thread, under a timeout), then the
  # whole run undisturbed: equal bit for bit.
  run_in_thread(lambda: model.fit(x[8 * steps_done :], y[8 * steps_done :], **fit))
  model_all, _, _, _ = _torch_model(0, run_eagerly)
  model_all.fit(x, y, **fit)
  got, want = _model_state(model), _model_state(model_all)
  assert_bitwise_equal(got["variables"], want["variables"])
  assert_bitwise_equal(got["optimizer"], want["optimizer"])
  assert int(model.optimizer.iterations.numpy()) == 5


# --------------------------------------------- the other path, in a child

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_graph_faults_on_the_other_call_path():
  """The graph-mode cases once more with the other call path (the native op
  or `tf.py_function`), in a child process: the variable must be set before
  torchbridge is imported."""
  env = dict(os.environ)
  other_is_py_function = tb.native_available()
  env.pop("TORCHBRIDGE_DISABLE_NATIVE", None)
  if other_is_py_function:
    env["TORCHBRIDGE_DISABLE_NATIVE"] = "1"
  code = (
    "import sys, pytest; sys.exit(pytest.main(["
    f"{__file__!r}, '-q', '-p', 'no:cacheprovider', "
    "'-k', 'function and not other_call_path']))"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code],
    env=env,
    cwd=_REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-4000:]
  assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]
  probe = subprocess.run(
    [sys.executable, "-c", "import torch, torchbridge as tb; print(tb.native_available())"],
    env=env,
    cwd=_REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
    timeout=300,
    check=True,
  )
  assert probe.stdout.split()[-1] == str(not other_is_py_function)
