"""C++ callbacks on the native op (csrc/native_callback.h), through the
benchmarks' no-Python bridge (benchmarks/scripted_native.py): the call runs
no Python, computes what torch autograd computes, frees what it saved, and
a failure is a TF error after which the next call works."""

import copy
import ctypes
import gc
import os
import sys

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _callbacks
from torchbridge._native import _loader
from torchbridge._native import _op

pytestmark = [
  pytest.mark.skipif(
    not _loader.has_torch_interop(), reason="needs the complete native op (C++ callbacks)"
  ),
  pytest.mark.usefixtures("bridge_runner"),  # graph calls on the torch runner
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from td3.networks import TorchCritic  # noqa: E402


@pytest.fixture(scope="module")
def scripted_native():
  from benchmarks import scripted_native  # builds its library on first use

  return scripted_native


def _native_count():
  count = ctypes.CDLL(str(_loader.loaded_from())).torchbridge_native_callback_count
  count.restype = ctypes.c_int64
  return count()


def _critic():
  torch.manual_seed(0)
  return TorchCritic(3, 1)


def _inputs():
  rng = np.random.default_rng(0)
  return (
    tf.constant(rng.standard_normal((6, 3), dtype=np.float32)),
    tf.constant(rng.standard_normal((6, 1), dtype=np.float32)),
  )


def _exported_critic(scripted_native):
  """A captured critic, its forward and backward callbacks, and its forward
  op's arguments for `_inputs()`."""
  module = scripted_native.ScriptedTorchModule(_critic(), "critic")
  obs, action = _inputs()
  module(obs, action)  # captures it
  forward, backward, _ = module._callbacks_for(((6, 3), (6, 1)))
  return module, forward, backward, [obs, action, *[tf.convert_to_tensor(v) for v in module.params]]


def _reference(critic_torch, obs_tf, action_tf):
  """Outputs and gradients of the loss below, by torch autograd."""
  obs = torch.from_numpy(obs_tf.numpy())
  action = torch.from_numpy(action_tf.numpy()).requires_grad_()
  q1, q2 = critic_torch(obs, action)
  loss = (q1**2).mean() + 3.0 * q2.mean()
  grads = torch.autograd.grad(loss, [action, *critic_torch.parameters()])
  return (q1.detach().numpy(), q2.detach().numpy()), [g.numpy() for g in grads]


def _loss_and_grads(module, obs, action):
  with tf.GradientTape() as tape:
    tape.watch(action)
    q1, q2 = module(obs, action)
    loss = tf.reduce_mean(q1**2) + 3.0 * tf.reduce_mean(q2)
  return (q1, q2), tape.gradient(loss, [action, *module.trainable_variables])


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_a_cpp_callback_computes_what_torch_autograd_does(scripted_native, mode):
  critic_torch = _critic()
  module = scripted_native.ScriptedTorchModule(copy.deepcopy(critic_torch), "critic")
  obs, action = _inputs()
  run = _loss_and_grads if mode == "eager" else tf.function(_loss_and_grads)
  (q1, q2), grads = run(module, obs, action)
  (q1_ref, q2_ref), grads_ref = _reference(critic_torch, obs, action)
  np.testing.assert_allclose(q1.numpy(), q1_ref, rtol=1e-5)
  np.testing.assert_allclose(q2.numpy(), q2_ref, rtol=1e-5)
  assert len(grads) == len(grads_ref)
  for g, g_ref in zip(grads, grads_ref):
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-5, atol=1e-7)
  # The forward's record went with its handle, once the backward was done.
  del grads
  gc.collect()
  assert module.records() == 0


def test_a_cpp_callback_runs_no_python(scripted_native, monkeypatch):
  # The kernel would call the registered NativeCallback object if it ran
  # Python for the call: that raises, so a passing call ran none.
  module = scripted_native.ScriptedTorchModule(_critic(), "critic")
  obs, action = _inputs()
  calls = []
  real = _callbacks.NativeCallback.__call__

  def spy(self, *args):
    calls.append(args)
    return real(self, *args)

  monkeypatch.setattr(_callbacks.NativeCallback, "__call__", spy)
  tf.function(_loss_and_grads)(module, obs, action)
  assert calls == []
  with pytest.raises(RuntimeError, match="runs only in the native op's CPU kernel"):
    _callbacks.NativeCallback(0, 0)([])


def test_an_inference_call_records_nothing(scripted_native):
  module = scripted_native.ScriptedTorchModule(_critic(), "critic")
  obs, action = _inputs()
  q1, _ = tf.function(lambda: module(obs, action))()
  assert q1.shape == (6, 1)
  # Nothing consumed the handle: no autograd record was made.
  assert module.records(made=True) == 0
  # A training call makes one (and frees it with its handle).
  tf.function(_loss_and_grads)(module, obs, action)
  assert module.records(made=True) == 1
  assert module.records() == 0


def test_a_failing_cpp_callback_is_a_tf_error_and_the_next_call_works(scripted_native):
  module, forward, backward, args = _exported_critic(scripted_native)
  # Three outputs declared besides the handle; the module returns two.
  with pytest.raises(
    tf.errors.InternalError,
    match="C\\+\\+ callback failed: the program returned 2 tensors, the op declares 3",
  ):
    _op.call(forward, args, [tf.int8] + [tf.float32] * 3)
  # A shape the graph declared that the output does not have: the kernel's
  # own check, after which it frees what the callback made.
  with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
    _op.call(forward, args, [tf.int8, tf.float32, tf.float32], [[1], [5, 1], [6, 1]])

  # A backward op whose outputs are not its forward's arguments.
  @tf.function
  def mismatched():
    handle, q1, q2 = _op.call(forward, args, [tf.int8, tf.float32, tf.float32])
    return _op.call(backward, [handle, q1, q2], [tf.float32])

  with pytest.raises(tf.errors.InternalError, match="do not match its forward"):
    mismatched()
  q1, q2 = module(*args[:2])
  assert q1.shape == q2.shape == (6, 1)
  gc.collect()
  assert module.records() == 0


def test_a_graphs_cpp_callbacks_are_unregistered_with_it(scripted_native):
  _, forward, _, args = _exported_critic(scripted_native)
  gc.collect()
  before = _native_count()

  def make():
    @tf.function
    def f():
      return _op.call(forward, args, [tf.int8, tf.float32, tf.float32], [[1], [6, 1], [6, 1]])[1]

    f()
    return f

  f = make()
  assert _native_count() == before + 1  # while the graph lives
  del f
  gc.collect()
  assert _native_count() == before


def test_native_callback_needs_the_native_op_loaded(monkeypatch):
  monkeypatch.setattr(_callbacks, "_set_native", None)
  before = _callbacks.registered_count()
  with pytest.raises(RuntimeError, match="needs the native op loaded"):
    _callbacks.register(_callbacks.NativeCallback(1, 2), None)
  assert _callbacks.registered_count() == before


def test_the_tf_side_is_unchanged_for_python_callbacks():
  # A Python callback on an op whose id has no C++ callback still runs.
  x = tf.constant([1.0, 2.0])
  [y] = _op.call(lambda args, unused: [args[0] * 2], [x], [tf.float32], [[2]], torch_tensors=True)
  np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])
  assert tb.native_available()


def test_the_no_python_floor_hands_back_fresh_tensors_of_the_shapes(scripted_native):
  critic_torch = _critic()
  floor = scripted_native.NoPythonFloorModule(critic_torch, "floor")
  obs, action = _inputs()
  (q1, q2), grads = tf.function(_loss_and_grads)(floor, obs, action)
  assert q1.shape == q2.shape == (6, 1)
  assert [tuple(g.shape) for g in grads] == [(6, 1)] + [
    tuple(p.shape) for p in critic_torch.parameters()
  ]
  # Its ops run C++ only: the kernel did not call the registered object.
  assert all(isinstance(c, _callbacks.NativeCallback) for c in floor._bare.values())


@pytest.mark.parametrize("boxed", [False, True])
def test_the_torch_linear_floor_computes_torchs_linear_in_cpp(scripted_native, boxed):
  # guard_cost's floors with torch's own work put back: their forward op's
  # C++ callback runs aten::linear on the op's input and parameters
  # (directly, or through the dispatcher's boxed call).
  torch.manual_seed(0)
  linear_torch = torch.nn.Linear(4, 3)
  floor = scripted_native.TorchLinearFloorModule(linear_torch, boxed=boxed)
  x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
  y = tf.function(lambda v: floor(v))(tf.constant(x))
  with torch.no_grad():
    want = linear_torch(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)
  assert isinstance(floor._linear, _callbacks.NativeCallback)
  with pytest.raises(TypeError, match="runs a torch.nn.Linear, got"):
    scripted_native.TorchLinearFloorModule(torch.nn.ReLU())
