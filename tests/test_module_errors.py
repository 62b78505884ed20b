"""`tb.TorchModule` error paths: a clear error, nothing lost, the next call
works."""

import re
import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from _module_helpers import BNNet
from _module_helpers import assert_same_values
from _module_helpers import data
from _module_helpers import maybe_function
from _module_helpers import mode_param
from _module_helpers import seeded
from _module_helpers import values

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


# ------------------------------------------------------------ construction


@pytest.mark.parametrize(
  "not_a_module",
  [lambda x: x, torch.ones(3), "linear", None, torch.nn.Linear],
  ids=["function", "tensor", "string", "none", "class"],
)
def test_non_module_is_rejected_with_a_type_error(not_a_module):
  with pytest.raises(TypeError) as info:
    tb.TorchModule(not_a_module)
  message = str(info.value)
  assert "TorchModule(module) expects a torch.nn.Module" in message
  assert f"of type {type(not_a_module).__name__}." in message
  assert "tb.torch_function" in message


def test_uninitialized_lazy_module_is_rejected_naming_the_parameter():
  lazy = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LazyLinear(2))
  with pytest.raises(ValueError) as info:
    tb.TorchModule(lazy, name="pi")
  message = str(info.value)
  assert "'1.weight'" in message and "not initialized" in message
  assert "'pi'" in message
  assert "Run the torch module once on an example input" in message
  # After running it once, it wraps fine.
  lazy(torch.zeros(1, 3))
  actor = tb.TorchModule(lazy, name="pi")
  assert "pi/1.weight:0" in [v.name for v in actor.trainable_variables]


def test_meta_module_is_rejected():
  with pytest.raises(ValueError, match=r"'weight' is on the meta device"):
    tb.TorchModule(torch.nn.Linear(3, 2, device="meta"))


# ----------------------------------------------------------- bad inputs


def _check_intact_then_valid_call(actor, net_ref, before, mode):
  """The variables are unchanged and a valid call gives torch's result."""
  assert_same_values(before, values(actor))
  x = data([6, 3], seed=5)
  call = maybe_function(mode, lambda x: actor(x, training=True))
  out = call(tf.constant(x))
  with torch.no_grad():
    want = net_ref.train()(torch.from_numpy(x))
  np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(
    actor.get_weights()["bn.running_mean"], net_ref.state_dict()["bn.running_mean"].numpy()
  )


BAD_INPUTS = {
  # float64 into a float32 module
  "dtype": (
    lambda: data([4, 3], dtype=np.float64),
    r"must have the same dtype, but got Double and Float",
  ),
  # wrong feature size
  "width": (
    lambda: data([4, 7]),
    # torch's message on real tensors, and on meta tensors
    r"\(4x7 and 3x5\)|\[4, 7\] X \[3, 5\]",
  ),
  # wrong rank (BatchNorm1d takes 2-D or 3-D input)
  "rank": (lambda: data([3]), r"expected 2D or 3D input \(got 1D input\)"),
}


@mode_param
@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_input_gives_torch_error_and_leaves_everything_intact(mode, bad):
  net = seeded(0, BNNet)
  net_ref = seeded(0, BNNet)
  actor = tb.TorchModule(net, name="actor")
  # Trace and run a valid call first: the module's state is not fresh.
  x_ok = data([6, 3], seed=4)
  actor(tf.constant(x_ok), training=True)
  with torch.no_grad():
    net_ref.train()(torch.from_numpy(x_ok))
  before = values(actor)
  make_x, message = BAD_INPUTS[bad]
  call = maybe_function(mode, lambda x: actor(x, training=True))
  # Eagerly torch's own exception; inside tf.function either found while
  # tracing (on meta tensors) or when running: in both the torch message.
  errors = (RuntimeError, ValueError, tf.errors.OpError)
  with pytest.raises(errors, match=message):
    call(tf.constant(make_x()))
  _check_intact_then_valid_call(actor, net_ref, before, mode)


@pytest.mark.parametrize("kind", ["string", "ragged", "sparse"])
def test_unsupported_tensor_kinds_are_rejected_before_torch_runs(kind):
  net = seeded(0, BNNet)
  actor = tb.TorchModule(net, name="actor")
  before = values(actor)
  x = {
    "string": lambda: tf.constant(["a", "b"]),
    "ragged": lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]),
    "sparse": lambda: tf.sparse.from_dense(tf.eye(3)),
  }[kind]()
  with pytest.raises(TypeError, match=r"actor\(\) received"):
    actor(x)
  assert_same_values(before, values(actor))
  actor(tf.constant(data([4, 3])), training=True)


# ------------------------------------------------- exceptions inside torch


class ForwardFailed(Exception):
  pass


class Fragile(torch.nn.Module):
  """BatchNorm, then an exception when told to: after the buffers changed."""

  def __init__(self):
    super().__init__()
    self.inner = BNNet()
    self.fail = False

  def forward(self, x):
    y = self.inner(x)
    if self.fail and not x.is_meta:
      raise ForwardFailed("the torch forward gave up")
    return y


@mode_param
@pytest.mark.parametrize("with_tape", [False, True], ids=["call", "tape"])
def test_exception_inside_forward_reaches_caller_and_loses_nothing(mode, with_tape):
  net = seeded(0, Fragile)
  net_ref = seeded(0, BNNet)
  actor = tb.TorchModule(net, name="fragile")
  tvars = actor.trainable_variables

  def call(x):
    if not with_tape:
      return actor(x, training=True), []
    with tf.GradientTape() as tape:
      y = actor(x, training=True)
      loss = tf.reduce_sum(y**2)
    return y, tape.gradient(loss, tvars)

  call = maybe_function(mode, call)
  x = data([6, 3], seed=4)
  call(tf.constant(x))  # traces, and updates the BN statistics once
  with torch.no_grad():
    net_ref.train()(torch.from_numpy(x))
  before = values(actor)

  net.fail = True
  if mode == "eager":
    with pytest.raises(ForwardFailed, match="the torch forward gave up"):
      call(tf.constant(x))
  else:
    with pytest.raises(tf.errors.OpError) as info:
      call(tf.constant(x))
    message = str(info.value)
    assert "ForwardFailed" in message
    assert "the torch forward gave up" in message
    assert "Traceback" in message and "test_module_errors.py" in message
  assert_same_values(before, values(actor))
  assert all(m.training for m in net.modules())  # modes restored too

  net.fail = False
  x2 = data([6, 3], seed=8)
  y, grads = call(tf.constant(x2))
  with torch.no_grad():
    want = net_ref.train()(torch.from_numpy(x2))
  np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
  assert actor.get_weights()["inner.bn.num_batches_tracked"] == 2
  if with_tape:
    assert len(grads) == len(tvars)
    assert all(g is not None for g in grads)
    assert np.any(grads[-1].numpy() != 0)  # l2.weight


def test_torch_modes_are_restored_after_an_exception():
  net = seeded(0, Fragile)
  net.eval()
  net.inner.bn.train()
  modes = [m.training for m in net.modules()]
  actor = tb.TorchModule(net, name="fragile")
  net.fail = True
  for training in (True, False):
    with pytest.raises(ForwardFailed):
      actor(tf.constant(data([4, 3])), training=training)
    assert [m.training for m in net.modules()] == modes


# --------------------------------------------------------------- training=


@pytest.mark.parametrize(
  "training", ["yes", 1, 0.0, [True]], ids=["string", "int", "float", "list"]
)
def test_training_must_be_a_bool(training):
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  before = values(actor)
  with pytest.raises(TypeError) as info:
    actor(tf.constant(data([4, 3])), training=training)
  message = str(info.value)
  assert "actor(training=...) must be None, True or False" in message
  assert repr(training) in message
  assert_same_values(before, values(actor))


def test_training_as_a_tensor_works_eagerly_but_not_inside_tf_function():
  net = seeded(0, BNNet)
  actor = tb.TorchModule(net, name="actor")
  x = tf.constant(data([4, 3]))
  actor(x, training=tf.constant(True))
  assert actor.get_weights()["bn.num_batches_tracked"] == 1
  actor(x, training=np.bool_(False))
  assert actor.get_weights()["bn.num_batches_tracked"] == 1

  @tf.function
  def call(x, training):
    return actor(x, training=training)

  with pytest.raises(TypeError, match=r"pass a Python bool"):
    call(x, tf.constant(True))
  call(x, True)  # a Python bool traces one function per mode
  assert actor.get_weights()["bn.num_batches_tracked"] == 2


def test_xla_compilation_is_refused_with_the_alternative(monkeypatch):
  from torchbridge._native import _xla  # where its library cannot be had

  monkeypatch.setattr(_xla, "unavailable", lambda: "no compiler (test)")
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  call = tf.function(lambda x: actor(x, training=False), jit_compile=True)
  with pytest.raises(NotImplementedError, match=r"jit_compile=False") as info:
    call(tf.constant(data([4, 3])))
  assert re.search(r"tb\.translate\(module,\s+input_signature\)", str(info.value))


def test_a_non_tensor_where_a_tensor_is_expected_names_no_parameter_as_an_argument():
  actor = tb.TorchModule(torch.nn.Linear(3, 5), name="actor")
  with pytest.raises(TypeError) as info:
    tf.function(lambda: actor(object()))()
  message = str(info.value)
  assert re.search(
    r"tensor arguments of shapes and dtypes\s+\(none\) \(and the module's 2", message
  )
  assert "must be Tensor, not object" in message  # torch's own words kept
  np.testing.assert_array_equal(actor(tf.zeros([2, 3])).shape, [2, 5])  # still usable


def test_wrong_shape_found_while_tracing_keeps_torch_error_type_and_names_inputs():
  # An input error shows while tracing (on meta tensors): the message is the
  # user's error, not advice about output_signature, which would not help.
  actor = tb.TorchModule(torch.nn.Linear(3, 5), name="actor")
  call = tf.function(lambda x: actor(x))
  with pytest.raises(RuntimeError) as info:
    call(tf.zeros([4, 7]))
  message = str(info.value)
  assert "actor failed while tf.function traced it" in message
  # The caller's tensor arguments, and the module's parameters apart (they
  # are op inputs too, but not what the caller passed).
  assert re.search(
    r"tensor arguments of shapes and dtypes\s+\(4, 7\) float32 \(and the module's 2", message
  )
  assert "(5, 3) float32" not in message and "(5,) float32" not in message
  assert "Declare the outputs" not in message  # no output_signature advice
  assert "[4, 7] X [3, 5]" in message  # torch's own message is kept
  np.testing.assert_array_equal(actor(tf.zeros([2, 3])).shape, [2, 5])
