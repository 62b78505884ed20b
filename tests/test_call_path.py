"""The per-call path's shortcuts give what the general path gives.

The per-call path avoids Python frames (docs/performance/timeline.md, "Per
call"): the output check runs as loops over precomputed dims, a flat tuple
of tensors skips `tf.nest`, and a module's modes and dtype errors need no
context managers. Each shortcut is held here against what it stands for.
"""

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._call import _output_check
from torchbridge._call import _signature

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


def _check(*specs):
  return _output_check.OutputCheck(list(specs), "f", _signature.DECLARED)


@pytest.mark.parametrize(
  "spec,shape",
  [
    (tf.TensorSpec([2, 3]), (2, 3)),
    (tf.TensorSpec([None, 3]), (7, 3)),
    (tf.TensorSpec([2, None]), (2, 1)),
    (tf.TensorSpec([None, None]), (0, 5)),
    (tf.TensorSpec(None), (4, 1, 2)),
    (tf.TensorSpec([]), ()),
  ],
)
def test_output_check_accepts_every_shape_the_spec_allows(spec, shape):
  check = _check(spec, spec)  # two outputs: the general loop, not the single fast path
  check([torch.zeros(shape), torch.zeros(shape)])
  _check(spec)([torch.zeros(shape)])


@pytest.mark.parametrize(
  "spec,shape",
  [
    (tf.TensorSpec([2, 3]), (2, 4)),
    (tf.TensorSpec([None, 3]), (7, 4)),
    (tf.TensorSpec([None, 3]), (7, 3, 1)),
    (tf.TensorSpec([2, None]), (3, 1)),
    (tf.TensorSpec([None]), ()),
  ],
)
def test_output_check_refuses_a_shape_the_spec_does_not_allow(spec, shape):
  for check in (_check(tf.TensorSpec([1]), spec), _check(spec)):
    outs = (
      [torch.zeros(shape)] if len(check._expected) == 1 else [torch.zeros(1), torch.zeros(shape)]
    )
    with pytest.raises(ValueError, match=r"has shape .* but .* was declared"):
      check(outs)
    # is_compatible_with agrees: the loops say what TF's shapes say.
    assert not spec.shape.is_compatible_with(shape)


def test_output_check_refuses_a_dtype_and_skips_outputs_left_out():
  check = _check(tf.TensorSpec([None, 2]), tf.TensorSpec([None, 2], tf.int64))
  check([None, torch.zeros(3, 2, dtype=torch.int64)])  # output 0 unused: left out
  with pytest.raises(TypeError, match=r"f output 1 has dtype torch.float32, but int64"):
    check([torch.zeros(3, 2), torch.zeros(3, 2)])
  with pytest.raises(ValueError, match=r"returned 1 tensors, but 2"):
    check([torch.zeros(3, 2)])


def test_a_flat_tuple_result_falls_back_when_a_later_call_holds_a_number():
  # Declared as a flat tuple of tensors: later calls take the shortcut
  # (a list of the tuple) unless a leaf is not a plain tensor; a number is
  # then made a tensor, as the general path does.
  calls = []

  def fn(x):
    calls.append(1)
    return (x * 2, 1.5 if len(calls) > 1 else torch.tensor(1.5))

  f = tb.torch_function(
    fn, output_signature=(tf.TensorSpec([None, 2]), tf.TensorSpec([], tf.float32))
  )
  run = tf.function(lambda x: f(x))
  for _ in range(2):
    doubled, number = run(tf.ones([3, 2]))
    np.testing.assert_array_equal(doubled.numpy(), np.full([3, 2], 2.0, np.float32))
    assert float(number) == 1.5


def test_a_flat_tuple_of_parameters_crosses_as_the_general_path_does():
  # nn.Parameter is a tensor subclass: not the shortcut's plain tensor.
  weight = torch.nn.Parameter(torch.arange(4.0).reshape(2, 2))
  f = tb.torch_function(lambda x: (x + 1, weight * 1), name="pair")
  a, b = tf.function(lambda x: f(x))(tf.zeros([2, 2]))
  np.testing.assert_array_equal(a.numpy(), np.ones([2, 2], np.float32))
  np.testing.assert_array_equal(b.numpy(), weight.detach().numpy())


class _TwoModes(torch.nn.Module):
  """Returns 1 in training mode and 0 in eval mode, and fails on float64."""

  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(2, 2)

  def forward(self, x):
    y = self.linear(x)
    return y * 0 + (1.0 if self.training else 0.0)


def _called_in_training_mode(graph):
  """A `_TwoModes` in eval mode, and a call of its wrapper with
  training=True (in a tf.function if `graph`)."""
  module_torch = _TwoModes().eval()
  module = tb.TorchModule(module_torch, name="two_modes")

  def call(x):
    return module(x, training=True)

  return module_torch, tf.function(call) if graph else call


@pytest.mark.parametrize("graph", [False, True])
def test_a_module_calls_modes_are_set_for_the_call_and_restored(graph):
  module_torch, call = _called_in_training_mode(graph)
  out = call(tf.ones([1, 2]))
  np.testing.assert_array_equal(out.numpy(), np.ones([1, 2], np.float32))
  assert not module_torch.training and not module_torch.linear.training


@pytest.mark.parametrize("graph", [False, True])
def test_a_module_calls_dtype_error_names_the_fix_and_modes_come_back(graph):
  module_torch, call = _called_in_training_mode(graph)
  # In a graph the op fails with TF's error, carrying the same message.
  with pytest.raises(
    (RuntimeError, TypeError, tf.errors.OpError), match=r"Cast the inputs to float32"
  ):
    call(tf.ones([1, 2], tf.float64))
  assert not module_torch.training and not module_torch.linear.training


def test_eager_reads_are_raw_ops_only_where_no_tape_could_record(monkeypatch):
  from torchbridge._frameworks import _compat

  plain = tf.Variable([[1.0, 2.0]])
  cached = tf.Variable([3.0], caching_device="/cpu:0")
  raw_reads = []
  read_op = tf.raw_ops.ReadVariableOp

  def spy(**kwargs):
    raw_reads.append(kwargs["resource"])
    return read_op(**kwargs)

  monkeypatch.setattr(tf.raw_ops, "ReadVariableOp", spy)
  values = _compat.read_values([plain, cached])
  np.testing.assert_array_equal(values[0].numpy(), [[1.0, 2.0]])
  np.testing.assert_array_equal(values[1].numpy(), [3.0])
  assert raw_reads == [plain.handle]  # the caching-device one goes the general way
  with tf.GradientTape() as tape:
    _compat.read_values([plain])
  assert len(raw_reads) == 1  # a tape could record: the variable's own read
  assert [v.ref() for v in tape.watched_variables()] == [plain.ref()]


def test_an_eager_module_call_reads_current_values_and_a_tape_still_sees_them():
  module = tb.TorchModule(torch.nn.Linear(2, 1, bias=False), name="lin")
  (weight,) = module.trainable_variables
  x = tf.ones([1, 2])
  weight.assign([[1.0, 2.0]])
  np.testing.assert_allclose(module(x).numpy(), [[3.0]])
  weight.assign([[5.0, 5.0]])  # read again on the next call, not kept
  np.testing.assert_allclose(module(x).numpy(), [[10.0]])
  with tf.GradientTape() as tape:
    y = module(x)
  np.testing.assert_allclose(tape.gradient(y, weight).numpy(), [[1.0, 1.0]])
