"""The one call protocol: the core runs a `Forward`; the wrappers are
adapters that bind their arguments and call `call_bridged`.

A new wrapper, written here from the `_call` layer's entry alone (the way a
new file in `torchbridge/_wrappers/` would be), works eagerly and in
`tf.function`, with gradients that match torch autograd; and each public
wrapper reaches the core through `call_bridged`, once per call.
"""

import inspect

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge import _call
from torchbridge._call import _bridge
from torchbridge._call import _saved
from torchbridge._native import _loader
from torchbridge.keras import TorchLayer

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


class Clipped:
  """A wrapper nobody wrote before: `fn(*args)` clipped to [-limit, limit].

  Everything it needs of the bridge is the `_call` layer's entry."""

  def __init__(self, fn, limit):
    self._fn = fn
    self._limit = limit

  def __call__(self, *args, **kwargs):
    call = _call.bind_arguments("clipped", (args, kwargs))
    if not tf.executing_eagerly():
      _call.check_not_xla("clipped")

    def run(args_torch):
      a, kw = call.substitute(args_torch)
      return torch.clamp(self._fn(*a, **kw), -self._limit, self._limit)

    return _call.call_bridged(run, call.args_tf, "clipped")


def _reference(x, w):
  x_torch = torch.tensor(x.numpy(), requires_grad=True)
  w_torch = torch.tensor(w.numpy(), requires_grad=True)
  y_torch = torch.clamp(x_torch * w_torch, -1.0, 1.0)
  y_torch.sum().backward()
  return y_torch.detach().numpy(), x_torch.grad.numpy(), w_torch.grad.numpy()


@pytest.mark.parametrize("in_graph", [False, True])
def test_a_new_wrapper_from_the_call_layer_alone(in_graph):
  wrapper = Clipped(lambda x, w: x * w, limit=1.0)
  x = tf.constant([-3.0, -0.5, 0.25, 2.0])
  w = tf.Variable([1.0, 2.0, 3.0, 4.0])

  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = wrapper(x, w)
      loss = tf.reduce_sum(y)
    return (y,) + tuple(tape.gradient(loss, [x, w]))

  y, dx, dw = tf.function(step)(x) if in_graph else step(x)
  y_ref, dx_ref, dw_ref = _reference(x, w)
  np.testing.assert_array_equal(y.numpy(), y_ref)
  np.testing.assert_array_equal(dx.numpy(), dx_ref)
  np.testing.assert_array_equal(dw.numpy(), dw_ref)


def test_the_new_wrapper_is_one_op_in_a_graph():
  wrapper = Clipped(lambda x: x * 2, limit=1.0)
  graph = tf.function(wrapper).get_concrete_function(tf.TensorSpec([None], tf.float32)).graph
  kinds = {op.type for op in graph.get_operations()}
  assert kinds & {"TorchbridgeCall", "EagerPyFunc"}, kinds


def test_the_core_runs_one_forward_protocol():
  """`_bridge.call` takes a `Forward` and nothing beside it (no `infer`),
  and runs a hand-written one eagerly and in a graph."""
  params = inspect.signature(_bridge.call).parameters
  assert list(params) == [
    "forward",
    "args_tf",
    "out_specs",
    "name",
    "differentiable",
    "specs_found",
  ]
  calls = []

  def forward(args_torch, *, record, unused=None):
    calls.append((record, unused))
    (x_torch,) = args_torch
    if record:
      x_torch.requires_grad_(True)
    return _saved.Saved([x_torch * 3], [x_torch if record else None], has_graph=record)

  x = tf.constant([1.0, 2.0])
  with tf.GradientTape() as tape:
    tape.watch(x)
    (y,) = _bridge.call(forward, [x])
  np.testing.assert_array_equal(y.numpy(), [3.0, 6.0])
  np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [3.0, 3.0])
  assert calls == [(True, None)]

  @tf.function
  def infer(x):
    return _bridge.call(forward, [x], [tf.TensorSpec([2], tf.float32)])[0]

  np.testing.assert_array_equal(infer(x).numpy(), [3.0, 6.0])
  # In a graph that asks no gradient the native op says nothing consumes the
  # handle: no recording. (The tf.py_function path cannot tell, so it
  # records.)
  assert calls[-1][0] is (not _loader.available())
  if _loader.available():
    assert 0 in calls[-1][1]  # output 0, the handle: unused


class _Count:
  def __init__(self, real):
    self.real, self.calls = real, 0

  def __call__(self, *args, **kwargs):
    self.calls += 1
    return self.real(*args, **kwargs)


@pytest.mark.parametrize("wrapper", ["torch_function", "TorchModule", "TorchLayer"])
def test_every_public_wrapper_goes_through_call_bridged(wrapper, monkeypatch):
  counter = _Count(_call.call_bridged)
  monkeypatch.setattr(_call, "call_bridged", counter)
  torch.manual_seed(0)
  net = torch.nn.Linear(3, 2)
  x = tf.ones([4, 3])
  if wrapper == "torch_function":
    y = tb.torch_function(lambda a: a * 2)(x)
  elif wrapper == "TorchModule":
    y = tb.TorchModule(net)(x)
  else:
    y = TorchLayer(net)(x)
  assert y.shape[0] == 4
  assert counter.calls == 1
