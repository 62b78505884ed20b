"""N Python threads driving their own `tf.function`s over bridged modules
(issue 28): one shared `TorchModule`, and one module per thread; forward and
backward. Results equal a sequential run's, nothing deadlocks (a thread still
alive after the timeout fails the test), and no update is lost or doubled.

On whichever path this process calls torch through (CI runs the suite with
the native op and again with TORCHBRIDGE_DISABLE_NATIVE=1).
"""

import threading
import time

import numpy as np
import pytest
import torch
from torch import nn
import keras
import tensorflow as tf

import torchbridge as tb
from _fault_helpers import assert_bitwise_equal
from _fault_helpers import bits
from _fault_helpers import fresh_values
from _fault_helpers import run_threads
from _fault_helpers import variable_values

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

THREADS = [1, 2, 4, 8]
CALLS = 6  # per thread


class Counted(torch.autograd.Function):
  """The identity, counting its forwards and backwards (real ones only)."""

  @staticmethod
  def forward(ctx, x, counts):  # pylint: disable=arguments-differ
    ctx.counts = counts
    counts.add("forward")
    return x.clone()

  @staticmethod
  def backward(ctx, dy):  # pylint: disable=arguments-differ
    ctx.counts.add("backward")
    return dy, None


class Counts:
  """Thread-safe counters."""

  def __init__(self):
    self._lock = threading.Lock()
    self.values = {"forward": 0, "backward": 0}

  def add(self, key):
    with self._lock:
      self.values[key] += 1


class MLP(nn.Module):
  def __init__(self, counts):
    super().__init__()
    self.l1 = nn.Linear(4, 16)
    self.l2 = nn.Linear(16, 3)
    self.counts = counts

  def forward(self, x):
    h = torch.tanh(self.l1(x))
    if not x.is_meta:
      h = Counted.apply(h, self.counts)
    return self.l2(h)


def _mlp(seed=0):
  counts = Counts()
  torch.manual_seed(seed)
  return MLP(counts).double(), counts


def _batch(thread, call):
  return (
    fresh_values([8, 4], seed=1000 * thread + call),
    fresh_values([8, 3], seed=1000 * thread + call + 500),
  )


def _gradient_function(actor):
  """A new tf.function: the loss and its gradients for the variables."""
  tvars = actor.trainable_variables

  @tf.function
  def loss_and_grads(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((actor(x) - y) ** 2)
    return loss, tape.gradient(loss, tvars)

  return loss_and_grads


def _results(fn, thread):
  """Each call's loss and gradients, as bytes, for `CALLS` batches."""
  out = []
  for call in range(CALLS):
    loss, grads = fn(*_batch(thread, call))
    out.append([bits(loss.numpy())] + [bits(g.numpy()) for g in grads])
  return out


@pytest.mark.parametrize("n_threads", THREADS)
def test_shared_module_forward_backward_equals_sequential_run(n_threads):
  # One TorchModule, one tf.function per thread, gradients (not applied)
  # per call: every call's loss and gradients bit for bit a sequential
  # run's, and exactly one forward and one backward per call.
  net, counts = _mlp()
  actor = tb.TorchModule(net, name="shared")
  want = [_results(_gradient_function(actor), k) for k in range(n_threads)]
  assert counts.values == {"forward": n_threads * CALLS, "backward": n_threads * CALLS}
  functions = [_gradient_function(actor) for _ in range(n_threads)]
  got = run_threads([lambda k=k: _results(functions[k], k) for k in range(n_threads)])
  assert got == want
  assert counts.values == {"forward": 2 * n_threads * CALLS, "backward": 2 * n_threads * CALLS}


class Linear(nn.Module):
  """`x @ w.T + b`, whose gradient for `sum(y * c)` does not depend on the
  weights: applied in any order, the updates give the same weights."""

  def __init__(self, counts):
    super().__init__()
    self.lin = nn.Linear(5, 3)
    self.counts = counts

  def forward(self, x):
    y = self.lin(x)
    if not x.is_meta:
      y = Counted.apply(y, self.counts)
    return y


def _integer_batch(thread, call):
  # Small integers: every product and sum is exact in float64, so the sum of
  # the updates is the same in any order, to the bit.
  rng = np.random.default_rng(1000 * thread + call)
  return (
    tf.constant(rng.integers(-3, 4, size=(4, 5)).astype(np.float64)),
    tf.constant(rng.integers(-3, 4, size=(4, 3)).astype(np.float64)),
  )


@pytest.mark.parametrize("n_threads", THREADS)
def test_shared_module_optimizer_updates_are_neither_lost_nor_doubled(n_threads):
  counts = Counts()
  torch.manual_seed(0)
  net = Linear(counts).double()
  with torch.no_grad():  # exact starting values too
    net.lin.weight.copy_(torch.round(net.lin.weight * 8) / 8)
    net.lin.bias.copy_(torch.round(net.lin.bias * 8) / 8)
  actor = tb.TorchModule(net, name="shared")
  tvars = actor.trainable_variables
  start = {v.name: v.numpy().copy() for v in tvars}
  opt = keras.optimizers.SGD(1.0)
  opt.build(tvars)

  def make_step():
    @tf.function
    def step(x, c):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(actor(x) * c)
      opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))

    return step

  steps = [make_step() for _ in range(n_threads)]

  def work(k):
    for call in range(CALLS):
      steps[k](*_integer_batch(k, call))
    return CALLS

  assert run_threads([lambda k=k: work(k) for k in range(n_threads)]) == [CALLS] * n_threads
  # Each update is -(c.T @ x) for the weight and -sum(c) for the bias.
  want_w = start["shared/lin.weight:0"].copy()
  want_b = start["shared/lin.bias:0"].copy()
  for k in range(n_threads):
    for call in range(CALLS):
      x, c = (t.numpy() for t in _integer_batch(k, call))
      want_w -= c.T @ x
      want_b -= c.sum(axis=0)
  got = {v.name: v.numpy() for v in tvars}
  assert bits(got["shared/lin.weight:0"]) == bits(want_w)
  assert bits(got["shared/lin.bias:0"]) == bits(want_b)
  # (Not `opt.iterations`: Keras 3 increments it by a read and an assign,
  # which concurrent steps can interleave, with or without torch.)
  assert counts.values == {"forward": n_threads * CALLS, "backward": n_threads * CALLS}


@pytest.mark.parametrize("n_threads", THREADS)
def test_separate_modules_train_as_they_would_one_after_another(n_threads):
  # One TorchModule, Adam optimizer and tf.function per thread, all from the
  # same starting weights, each on its own batches: every thread's final
  # variables and optimizer slots bit for bit those of the same training
  # run alone.

  def trainer():
    net, counts = _mlp(seed=0)
    actor = tb.TorchModule(net, name="mlp")
    tvars = actor.trainable_variables
    opt = keras.optimizers.Adam(0.01)

    @tf.function
    def step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((actor(x) - y) ** 2)
      opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))
      return loss

    def train(k):
      losses = [bits(step(*_batch(k, call)).numpy()) for call in range(CALLS)]
      state = variable_values(actor.variables)
      state.update({"opt/" + n: v for n, v in variable_values(opt.variables).items()})
      return losses, state, dict(counts.values)

    return train

  want = [trainer()(k) for k in range(n_threads)]
  trainers = [trainer() for _ in range(n_threads)]
  got = run_threads([lambda k=k: trainers[k](k) for k in range(n_threads)])
  for k in range(n_threads):
    assert got[k][0] == want[k][0], f"thread {k}: losses"
    assert_bitwise_equal(got[k][1], want[k][1], f"thread {k}")
    assert got[k][2] == {"forward": CALLS, "backward": CALLS}


# ------------------------------------------------------ buffers, shared


class SlowCounter(nn.Module):
  """Counts its calls in a buffer, as BatchNorm's num_batches_tracked; its
  first real call sleeps after it is announced."""

  def __init__(self):
    super().__init__()
    self.lin = nn.Linear(2, 2)
    self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
    self.started = threading.Event()

  def forward(self, x):
    self.calls.add_(1)
    if not x.is_meta and not self.started.is_set():
      self.started.set()
      time.sleep(0.3)
    return self.lin(x)


def _with_gradient(actor):
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(actor(x, training=True))
    grads = tape.gradient(loss, actor.trainable_variables)
    assert all(g is not None for g in grads)
    return loss

  return step


@pytest.mark.parametrize("mode", ["eager", "function", "one_function", "function_with_tape"])
def test_overlapping_calls_of_a_shared_module_lose_no_buffer_update(mode):
  net = SlowCounter()
  actor = tb.TorchModule(net, name="counter")
  calls = [(lambda x: actor(x, training=True)) for _ in range(2)]
  if mode == "function":  # two graphs
    calls = [tf.function(c) for c in calls]
  elif mode == "one_function":  # one graph, run by two threads at once
    calls = [tf.function(calls[0])] * 2
  elif mode == "function_with_tape":
    calls = [tf.function(_with_gradient(actor)) for _ in range(2)]
  x = tf.ones([1, 2])
  for call in calls:  # traced, and run once each
    call(x)
  assert int(actor.get_weights()["calls"]) == 2
  net.started.clear()

  def second():  # starts while the first call runs torch code
    assert net.started.wait(60)
    time.sleep(0.05)
    calls[1](x)

  run_threads([lambda: calls[0](x), second])
  assert int(actor.get_weights()["calls"]) == 4


@pytest.mark.parametrize("flow", ["while_loop", "cond", "two_calls"])
def test_graph_calls_that_write_buffers_count_once_each_in_control_flow(flow):
  # A graph call that writes buffers runs inside a tf.CriticalSection: in a
  # loop, a branch, or twice in one graph, each call's write lands once.
  net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
  actor = tb.TorchModule(net, name="bn")
  x = tf.random.stateless_normal([4, 3], seed=[1, 2])

  if flow == "while_loop":
    step = tf.function(
      lambda x: tf.while_loop(
        lambda i, y: i < 5, lambda i, y: (i + 1, actor(y, training=True)), [0, x]
      )[1]
    )
    calls = 5
  elif flow == "cond":
    step = tf.function(
      lambda x: tf.cond(tf.reduce_sum(x) > -1e9, lambda: actor(x, training=True), lambda: x)
    )
    calls = 1
  else:
    step = tf.function(lambda x: actor(actor(x, training=True), training=True))
    calls = 2
  start = actor.get_weights()
  got = step(x)
  assert int(actor.get_weights()["1.num_batches_tracked"]) == calls
  # The same calls in torch, from the same start.
  reference = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
  reference.load_state_dict({k: torch.as_tensor(v) for k, v in start.items()})
  y = torch.as_tensor(x.numpy())
  for _ in range(calls):
    y = reference.train()(y)
  np.testing.assert_allclose(got.numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    actor.get_weights()["1.running_mean"], reference[1].running_mean.numpy(), rtol=1e-5
  )
