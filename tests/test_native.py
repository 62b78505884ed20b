"""Tests for the native TF op `TorchbridgeCall` (_loader.py).

The whole module is skipped when the op cannot be built or loaded here (no
compiler, TORCHBRIDGE_DISABLE_NATIVE=1): the package then runs on the
tf.py_function path, which the other test modules cover. The loader and its
fallbacks are tested in test_native_loader.py, which runs everywhere.
"""

import gc
import os
import re
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf
import torch.utils.dlpack as torch_dlpack

import torchbridge as tb
from torchbridge._native import _loader
from torchbridge._native import _op
from torchbridge._native import _callbacks

from conftest import requires_gpu
from test_native_loader import _run_subprocess

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

if os.environ.get(_loader.DISABLE_ENV, "").strip() not in ("", "0") or (not _loader.available()):
  pytest.skip(f"native op not available: {_loader.status()}", allow_module_level=True)


def _identity(capsules):
  return [torch_dlpack.to_dlpack(torch_dlpack.from_dlpack(c)) for c in capsules]


def _data_ptr(x_tf):
  """Address of a TF tensor's buffer (through a torch view of it)."""
  return torch_dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(x_tf)).data_ptr()


def _returning(make_outputs):
  """A callback that ignores its inputs and returns `make_outputs()`."""

  def callback(capsules):
    del capsules
    return make_outputs()

  return callback


# ---------------------------------------------------------------------------
# Values, zero copy, shapes


def test_identity_in_tf_function_values_and_zero_copy():
  seen = {}

  def callback(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    seen["in"] = x.data_ptr()
    y = x * 2 + 1
    seen["out"] = y.data_ptr()
    return [torch_dlpack.to_dlpack(y)]

  @tf.function
  def f(x):
    return _op.call(callback, [x], [tf.float32], [x.shape])[0]

  x = tf.random.normal([16, 5])
  y = f(x)
  np.testing.assert_allclose(y.numpy(), x.numpy() * 2 + 1, rtol=1e-6)
  # The torch input was a view of the TF input, and the TF output is the
  # very buffer torch wrote.
  assert seen["in"] == _data_ptr(x)
  assert _data_ptr(y) == seen["out"]


def test_static_shapes_in_graph():
  specs = []

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  def f(x):
    outs = _op.call(
      _returning(
        lambda: [
          torch_dlpack.to_dlpack(torch.zeros(2, 3)),
          torch_dlpack.to_dlpack(torch.zeros(4)),
          torch_dlpack.to_dlpack(torch.zeros(2, 2)),
        ]
      ),
      [x],
      [tf.float32, tf.float32, tf.float32],
      [[None, 3], [4], None],
    )
    specs.extend(o.shape for o in outs)
    return outs

  graph = f.get_concrete_function().graph
  assert [s.as_list() if s.rank is not None else None for s in specs] == [[None, 3], [4], None]
  op = next(o for o in graph.get_operations() if o.type == "TorchbridgeCall")
  assert op.outputs[0].shape.as_list() == [None, 3]
  assert op.get_attr("Tout") == [tf.float32] * 3
  outs = f(tf.zeros([2, 3]))
  assert [tuple(o.shape) for o in outs] == [(2, 3), (4,), (2, 2)]


@pytest.mark.parametrize(
  "dtype",
  [
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.int8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.uint8,
    tf.uint16,
    tf.uint32,
    tf.uint64,
    tf.bool,
    tf.complex64,
    tf.complex128,
  ],
)
def test_dtypes_round_trip(dtype):
  values = np.arange(12).reshape(3, 4) % 3
  x = tf.cast(tf.constant(values), dtype)

  @tf.function
  def f(x):
    return _op.call(_identity, [x], [dtype], [[3, 4]])[0]

  y = f(x)
  assert y.dtype == dtype
  np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_scalars_empty_tensors_and_no_tensors():
  calls = []

  def callback(capsules):
    calls.append(len(capsules))
    ins = [torch_dlpack.from_dlpack(c) for c in capsules]
    return [
      torch_dlpack.to_dlpack(ins[0] + 1),
      torch_dlpack.to_dlpack(torch.zeros(0, 3)),
      torch_dlpack.to_dlpack(ins[1].clone()),
    ]

  def nothing(capsules):
    calls.append(len(capsules))
    return []

  @tf.function
  def f(s, e):
    outs = _op.call(callback, [s, e], [tf.float32, tf.float32, tf.int64], [[], [0, 3], [None]])
    with tf.control_dependencies(outs):
      _op.call(nothing, [], [], [])
    return outs

  s, z, e = f(tf.constant(2.0), tf.zeros([0], tf.int64))
  assert float(s) == 3.0 and s.shape == ()
  assert z.shape == (0, 3) and e.shape == (0,)
  assert calls == [2, 0]


def test_eager_call_runs_at_once_and_does_not_stay_registered():
  before = _callbacks.registered_count()
  y = _op.call(_identity, [tf.constant([1.0, 2.0])], [tf.float32])[0]
  np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])
  assert _callbacks.registered_count() == before


def test_several_ops_in_one_graph_and_downstream_tf_ops():
  def double(capsules):
    return [torch_dlpack.to_dlpack(torch_dlpack.from_dlpack(capsules[0]) * 2)]

  @tf.function
  def f(x):
    y = _op.call(double, [x], [tf.float32], [x.shape])[0]
    z = _op.call(double, [tf.sin(y)], [tf.float32], [x.shape])[0]
    return tf.reduce_sum(z * 3.0)

  x = tf.random.normal([64])
  # A sum of 64 random terms may cancel to near zero: atol for float32's sum.
  np.testing.assert_allclose(
    f(x).numpy(), np.sum(np.sin(x.numpy() * 2) * 2 * 3), rtol=1e-5, atol=1e-5
  )


def test_gradients_through_custom_gradient_and_none_without():
  def square(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    return [torch_dlpack.to_dlpack(x * x)]

  def square_grad(capsules):
    x, dy = [torch_dlpack.from_dlpack(c) for c in capsules]
    return [torch_dlpack.to_dlpack(2 * x * dy)]

  @tf.custom_gradient
  def f(x):
    y = _op.call(square, [x], [tf.float32], [x.shape])[0]
    return y, lambda dy: _op.call(square_grad, [x, dy], [tf.float32], [x.shape])[0]

  @tf.function
  def tape_inside(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(f(x))
    return tape.gradient(y, x)

  x = tf.constant([1.0, 2.0, 3.0])
  np.testing.assert_array_equal(tape_inside(x).numpy(), [2.0, 4.0, 6.0])
  outer = tf.function(lambda x: tf.reduce_sum(f(x)))
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = outer(x)
  np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 4.0, 6.0])
  # The bare op is not differentiable: a tape around it is no error.
  bare = tf.function(lambda x: tf.reduce_sum(_op.call(square, [x], [tf.float32], [x.shape])[0]))
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = bare(x)
  assert float(y) == 14.0
  assert tape.gradient(y, x) is None


# ---------------------------------------------------------------------------
# Errors


def _raises_value_error(capsules):
  del capsules
  raise ValueError("torch said no: bad value 42")


def test_python_exception_becomes_tf_error_with_traceback():
  calls = []

  def callback(capsules):
    calls.append(1)
    if len(calls) == 1:
      _raises_value_error(capsules)
    return _identity(capsules)

  @tf.function
  def f(x):
    return _op.call(callback, [x], [tf.float32], [[2]])[0]

  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    f(tf.ones([2]))
  message = info.value.message
  assert "ValueError" in message
  assert "torch said no: bad value 42" in message
  assert "Traceback (most recent call last)" in message
  assert "_raises_value_error" in message  # a frame of the traceback
  assert __file__ in message
  # The same function works on the next call.
  np.testing.assert_array_equal(f(tf.ones([2])).numpy(), [1.0, 1.0])


def test_other_exception_types_map_to_tf_codes():
  def raising(exc):
    def callback(capsules):
      del capsules
      raise exc

    return callback

  cases = [
    (RuntimeError("r"), tf.errors.UnknownError),
    (TypeError("t"), tf.errors.InvalidArgumentError),
    (NotImplementedError("n"), tf.errors.UnimplementedError),
    (tf.errors.FailedPreconditionError(None, None, "fp"), tf.errors.FailedPreconditionError),
  ]
  for exc, tf_error in cases:
    f = tf.function(lambda x, exc=exc: _op.call(raising(exc), [x], [tf.float32])[0])
    with pytest.raises(tf_error) as info:
      f(tf.ones([1]))
    assert type(exc).__name__ in info.value.message


@pytest.mark.parametrize(
  "case,pattern",
  [
    ("misaligned", "not 64-byte aligned"),
    ("dtype", "has dtype float64, but float was declared"),
    ("rank", "has shape [1024, 1], but [1024] was declared"),
    ("dim", "has shape [1000], but [1024] was declared"),
    ("too_many", "returned 2 tensors, but 1 outputs were declared"),
    ("too_few", "returned 0 tensors, but 1 outputs were declared"),
    ("non_contiguous", "is not contiguous"),
    ("not_a_capsule", "is a Tensor, not an unused DLPack capsule"),
    ("used_capsule", "capsule named 'used_dltensor'"),
    ("not_a_list", "must return a list of DLPack capsules"),
  ],
)
def test_bad_outputs_give_clear_errors(case, pattern):
  def used_capsule():
    cap = torch_dlpack.to_dlpack(torch.zeros(1024))
    torch_dlpack.from_dlpack(cap)
    return [cap]

  makers = {
    "misaligned": lambda: [torch_dlpack.to_dlpack(torch.randn(1025)[1:])],
    "dtype": lambda: [torch_dlpack.to_dlpack(torch.zeros(1024, dtype=torch.float64))],
    "rank": lambda: [torch_dlpack.to_dlpack(torch.zeros(1024, 1))],
    "dim": lambda: [torch_dlpack.to_dlpack(torch.zeros(1000))],
    "too_many": lambda: [
      torch_dlpack.to_dlpack(torch.zeros(1024)),
      torch_dlpack.to_dlpack(torch.zeros(1024)),
    ],
    "too_few": lambda: [],
    "non_contiguous": lambda: [torch_dlpack.to_dlpack(torch.zeros(32, 32).t())],
    "not_a_capsule": lambda: [torch.zeros(1024)],
    "used_capsule": used_capsule,
    "not_a_list": lambda: torch_dlpack.to_dlpack(torch.zeros(1024)),
  }
  shape = [32, 32] if case == "non_contiguous" else [1024]

  @tf.function
  def f(x):
    y = _op.call(_returning(makers[case]), [x], [tf.float32], [shape])[0]
    return y + 1.0  # a TF kernel that would crash on a bad buffer

  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    f(tf.zeros([3]))
  assert pattern in info.value.message
  assert "TorchbridgeCall" in info.value.message
  # The process is intact, and so is the op with a good output.
  good = tf.function(
    lambda x: (
      _op.call(
        _returning(lambda: [torch_dlpack.to_dlpack(torch.ones(shape))]), [x], [tf.float32], [shape]
      )[0]
      + 1.0
    )
  )
  assert float(tf.reduce_sum(good(tf.zeros([3])))) == 2.0 * 1024


def test_same_capsule_twice_is_refused():
  def callback(capsules):
    del capsules
    cap = torch_dlpack.to_dlpack(torch.zeros(4))
    return [cap, cap]

  f = tf.function(lambda x: _op.call(callback, [x], [tf.float32, tf.float32]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="same DLPack"):
    f(tf.zeros([1]))


def test_refused_outputs_are_released():
  # An output that fails the checks is not adopted; its capsule, dropped by
  # Python, gives the memory back to torch.
  fired = []

  def callback(capsules):
    del capsules
    t = torch.randn(1025)[1:]
    weakref.finalize(t, fired.append, 1)
    return [torch_dlpack.to_dlpack(t)]

  f = tf.function(lambda x: _op.call(callback, [x], [tf.float32]))
  for _ in range(5):
    with pytest.raises(tf.errors.InvalidArgumentError):
      f(tf.zeros([1]))
  gc.collect()
  assert len(fired) == 5


def test_unused_outputs_are_reported_and_may_be_left_out():
  seen = []

  def callback(capsules):
    seen.append((_callbacks.output_required(0), _callbacks.output_required(1)))
    x = torch_dlpack.from_dlpack(capsules[0])
    first = None if not _callbacks.output_required(0) else x + 1
    return [_callbacks._to_capsule(first), _callbacks._to_capsule(x * 2)]

  def two_outputs(x):
    return _op.call(callback, [x], [tf.float32, tf.float32], [x.shape, x.shape])

  only_second = tf.function(lambda x: two_outputs(x)[1])
  both = tf.function(lambda x: tf.add_n(two_outputs(x)))
  x_tf = tf.constant([1.0, 2.0])
  np.testing.assert_array_equal(only_second(x_tf), [2.0, 4.0])
  np.testing.assert_array_equal(both(x_tf), [4.0, 7.0])
  assert seen == [(False, True), (True, True)]
  # Outside a kernel's callback every output counts as required.
  assert _callbacks.output_required(0)


def test_none_for_a_used_output_is_a_clear_error():
  fn = tf.function(lambda x: _op.call(_returning(lambda: [None]), [x], [tf.float32], [[2]])[0] * 2)
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="output 0 from the torch callback is a NoneType"
  ):
    fn(tf.constant([1.0, 2.0]))
  # The process and the op go on.
  ok = tf.function(lambda x: _op.call(_identity, [x], [tf.float32], [[2]])[0])
  np.testing.assert_array_equal(ok(tf.constant([1.0, 2.0])), [1.0, 2.0])


class _CountingIdentity(torch.autograd.Function):
  """Identity whose backward counts its runs."""

  backward_calls = 0

  @staticmethod
  def forward(ctx, x):
    return x.view_as(x)

  @staticmethod
  def backward(ctx, dy):
    _CountingIdentity.backward_calls += 1
    return dy


def test_gradients_nothing_consumes_are_not_computed():
  # y = f(x) * w with a gradient asked for w only: the backward op's output
  # for x is consumed by nothing, so torch never runs x's part of the
  # backward (counted), and w's gradient is still exact. A tape that asks
  # for both gets both.
  @tb.torch_function
  def f(x, w):
    return torch.tanh(_CountingIdentity.apply(x)) * w

  x = tf.constant(np.linspace(-1.0, 1.0, 6))
  w = tf.Variable(np.linspace(0.5, 2.0, 6))

  @tf.function
  def grad_w_only(x):
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(f(x, w) ** 2)
    return tape.gradient(y, w)

  @tf.function
  def grad_both(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(f(x, w) ** 2)
    return tape.gradient(y, [x, w])

  t, w_np = np.tanh(x.numpy()), w.numpy()
  _CountingIdentity.backward_calls = 0
  for _ in range(3):
    np.testing.assert_allclose(grad_w_only(x).numpy(), 2 * t * w_np * t, rtol=1e-12)
  assert _CountingIdentity.backward_calls == 0
  grad_x, grad_w = grad_both(x)
  assert _CountingIdentity.backward_calls == 1
  np.testing.assert_allclose(grad_x.numpy(), 2 * t * w_np * w_np * (1 - t**2), rtol=1e-12)
  np.testing.assert_allclose(grad_w.numpy(), 2 * t * w_np * t, rtol=1e-12)


def test_inference_calls_record_no_autograd_graph():
  grad_modes = []

  @tb.torch_function
  def square(x):
    grad_modes.append(torch.is_grad_enabled())
    return x * x

  @tf.function
  def infer(x):
    return square(x)

  @tf.function
  def train(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = square(x)
    return tape.gradient(y, x)

  x_tf = tf.constant([1.0, 3.0])
  infer.get_concrete_function(x_tf)  # traces (on meta tensors)
  train.get_concrete_function(x_tf)
  grad_modes.clear()
  np.testing.assert_array_equal(infer(x_tf), [1.0, 9.0])
  np.testing.assert_array_equal(train(x_tf), [2.0, 6.0])
  # A tape around a call of the inference function: TF runs the function's
  # forward variant, whose handle output the backward consumes.
  with tf.GradientTape() as tape:
    tape.watch(x_tf)
    y_tf = infer(x_tf)
  np.testing.assert_array_equal(tape.gradient(y_tf, x_tf), [2.0, 6.0])
  assert grad_modes == [False, True, True]


def test_unregistered_callback_gives_clear_error():
  @tf.function
  def f(x):
    return _op.call(_identity, [x], [tf.float32])[0]

  graph = f.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
  ids = list(_callbacks._ids_of_graph[graph])  # pylint: disable=protected-access
  saved = {i: _callbacks.registry[i] for i in ids}  # pylint: disable=protected-access
  _callbacks.release(ids)  # pylint: disable=protected-access
  try:
    with pytest.raises(tf.errors.UnknownError, match="is not registered"):
      f(tf.ones([2]))
  finally:
    _callbacks.registry.update(saved)  # pylint: disable=protected-access
  np.testing.assert_array_equal(f(tf.ones([2])).numpy(), [1.0, 1.0])


# ---------------------------------------------------------------------------
# Threads and memory


def test_concurrent_calls_from_eight_threads():
  def callback(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    k = torch_dlpack.from_dlpack(capsules[1])
    return [torch_dlpack.to_dlpack(torch.tanh(x) * k + k)]

  @tf.function
  def f(x, k):
    return _op.call(callback, [x, k], [tf.float32], [x.shape])[0]

  check_from_eight_threads(f)


def check_from_eight_threads(f):
  """Calls `f(x, k)`, which must compute tanh(x) * k + k, from 8 threads at
  once (40 calls each, their own values) and checks every result."""
  f(tf.zeros([256]), tf.constant(0.0))
  errors = []
  barrier = threading.Barrier(8)

  def worker(index):
    try:
      rng = np.random.default_rng(index)
      barrier.wait()
      for _ in range(40):
        x = rng.standard_normal(256).astype(np.float32)
        y = f(tf.constant(x), tf.constant(float(index)))
        np.testing.assert_allclose(y.numpy(), np.tanh(x) * index + index, rtol=1e-5, atol=1e-5)
    except Exception as err:  # pylint: disable=broad-except
      errors.append(err)

  threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors[0]


def test_tf_threads_keep_their_python_thread_state_between_calls():
  # On TF's own threads the kernel makes one Python thread state per thread
  # and keeps it, so a threading.local() set by one callback is still there
  # in the next callback on the same thread (a fresh thread state per call
  # would lose it, and cost every call several microseconds).
  local = threading.local()
  seen = []  # (thread id, whether this thread state had run a callback)

  def callback(capsules):
    seen.append((threading.get_ident(), getattr(local, "ran", False)))
    local.ran = True
    return list(capsules)

  @tf.function
  def f(x):
    return _op.call(callback, [x], [tf.float32], [x.shape])[0]

  x = tf.ones([4])
  for _ in range(50):
    np.testing.assert_array_equal(f(x).numpy(), np.ones(4, np.float32))
  assert len(seen) == 50
  first_calls = [ran for _, ran in seen].count(False)
  assert first_calls == len({ident for ident, _ in seen}), seen
  # And a Python thread calling the op keeps working after it ends.
  results = []
  thread = threading.Thread(target=lambda: results.append(f(x).numpy()))
  thread.start()
  thread.join()
  np.testing.assert_array_equal(results[0], np.ones(4, np.float32))
  np.testing.assert_array_equal(f(x).numpy(), np.ones(4, np.float32))


def test_outputs_are_freed_when_tf_drops_them():
  made, freed = [], []

  def callback(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    y = x + 1
    made.append(1)
    weakref.finalize(y, freed.append, 1)
    return [torch_dlpack.to_dlpack(y)]

  @tf.function
  def returned(x):  # the output leaves the function
    return _op.call(callback, [x], [tf.float32], [x.shape])[0]

  @tf.function
  def internal(x):  # the output dies inside the graph, on a TF thread
    return tf.reduce_sum(_op.call(callback, [x], [tf.float32], [x.shape])[0])

  x = tf.zeros([1000])
  for _ in range(200):
    y = returned(x)
    s = internal(x)
  del y, s
  gc.collect()
  assert len(made) == 400
  assert len(freed) == 400


def _rss_mb():
  with open("/proc/self/status") as status_file:
    for line in status_file:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_many_calls_do_not_leak_memory():
  def callback(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    return [torch_dlpack.to_dlpack(x * 2)]

  @tf.function
  def f(x):
    return tf.reduce_sum(_op.call(callback, [x * 1.0], [tf.float32], [x.shape])[0])

  x = tf.ones([256, 1024])  # 1 MiB in, 1 MiB out per call
  for _ in range(50):
    f(x)
  gc.collect()
  start = _rss_mb()
  for _ in range(400):
    f(x)
  gc.collect()
  grown = _rss_mb() - start
  assert grown < 100, f"RSS grew by {grown:.0f} MiB over 400 calls"


def test_registrations_end_with_their_graph():
  gc.collect()
  before = _callbacks.registered_count()

  def make():
    @tf.function
    def f(x):
      return _op.call(_identity, [x], [tf.float32])[0]

    f(tf.ones([2]))
    return f

  f = make()
  assert _callbacks.registered_count() == before + 1
  del f
  gc.collect()
  assert _callbacks.registered_count() == before


# ---------------------------------------------------------------------------
# The torch-side helper


@pytest.mark.usefixtures("own_crossings_only")
def test_torch_callback_copies_only_what_tf_cannot_view():
  # The sources of the two outputs TF cannot view as they are: a view at an
  # offset of 4 bytes (not 64-byte aligned) and a transposed (non-contiguous)
  # view. The copies must hold exactly the sources' values.
  misaligned_source = torch.arange(1025, dtype=torch.float32)
  transposed_source = torch.arange(32, dtype=torch.float32).reshape(8, 4)
  seen = {}

  def fn(ins, unused):
    del unused
    doubled = ins[0] * 2
    seen["doubled"] = doubled.data_ptr()
    return [doubled, misaligned_source[1:], transposed_source.t()]

  @tf.function
  def f(x):
    return _op.call(_callbacks.torch_callback(fn), [x], [tf.float32] * 3, [x.shape, [1024], [4, 8]])

  tb.reset_exchange_stats()
  a, b, c = f(tf.ones([5]))
  np.testing.assert_array_equal(a.numpy(), [2.0] * 5)
  assert b.shape == (1024,) and c.shape == (4, 8)
  np.testing.assert_array_equal(b.numpy(), misaligned_source[1:].numpy())
  np.testing.assert_array_equal(c.numpy(), transposed_source.t().numpy())
  # The first output is the very buffer torch wrote; the other two are copies.
  assert _data_ptr(a) == seen["doubled"]
  assert _data_ptr(b) != misaligned_source[1:].data_ptr()
  assert _data_ptr(c) != transposed_source.data_ptr()
  stats = tb.exchange_stats()
  assert stats["zero_copy"] == 2  # the input and the first output
  assert stats["copied"] == 2
  assert stats["bytes_copied"] == 1024 * 4 + 32 * 4


# ---------------------------------------------------------------------------
# GPU (cannot run on a CPU-only machine)


@requires_gpu
def test_gpu_kernel_uses_tf_stream_and_stays_on_device():
  seen = {}

  def callback(capsules):
    x = torch_dlpack.from_dlpack(capsules[0])
    seen["device"] = x.device
    seen["stream"] = torch.cuda.current_stream().cuda_stream
    return [torch_dlpack.to_dlpack(x * 2)]

  with tf.device("GPU:0"):
    x = tf.random.normal([1024])

    @tf.function
    def f(x):
      return _op.call(callback, [x], [tf.float32], [x.shape])[0]

    y = f(x)
  np.testing.assert_allclose(y.numpy(), x.numpy() * 2, rtol=1e-6)
  assert seen["device"].type == "cuda"
  assert seen["stream"] != 0  # TF's stream, not torch's default one
  assert "GPU" in y.device


# ---------------------------------------------------------------------------
# SavedModel


def test_saved_model_call_fails_with_a_message_naming_savedmodel(tmp_path):
  # README, "Limitations": SavedModel export of the bridged ops is not
  # possible, since a SavedModel cannot carry the Python callables. What a
  # user sees who saves one anyway and calls it in another process that has
  # the op loaded: an error naming the cause, not a crash or an output.
  gc.collect()  # earlier tests' garbage, not inside the saving graph
  module = tb.TorchModule(torch.nn.Linear(3, 2), name="lin")
  root = tf.Module()
  root.module = module
  root.serve = tf.function(lambda x: module(x), input_signature=[tf.TensorSpec([None, 3])])
  root.serve(tf.ones([2, 3]))
  path = str(tmp_path / "saved")
  tf.saved_model.save(root, path)
  result = _run_subprocess(
    f"""
      assert _loader.available(), _loader.status()
      loaded = tf.saved_model.load({path!r})
      try:
        out = loaded.serve(tf.ones([2, 3]))
        result = {{"ran": True, "out": out.numpy().tolist()}}
      except Exception as err:  # pylint: disable=broad-except
        result = {{"ran": False, "type": type(err).__name__,
                   "message": str(err)}}
      print(json.dumps(result))
      """,
    {_loader.DISABLE_ENV: None},
  )
  assert not result["ran"], result
  assert "SavedModel" in result["message"], result
  assert "cannot carry torch" in result["message"], result


@pytest.mark.slow  # two processes each (~25 s): make test-long
@pytest.mark.parametrize("runner", ["C++", "python"])
def test_a_saved_models_torch_call_never_runs_another_processes_callback(tmp_path, runner):
  # The same program run twice registers the same callbacks in the same
  # order. A SavedModel written by the first run and called in the second
  # must fail, naming the cause, not run the second run's own module
  # (here: other weights) under the op's callback id.
  path = str(tmp_path / "saved")
  program = f"""
      import torchbridge as tb
      seed = int({{seed}})
      torch.manual_seed(seed)
      module = tb.TorchModule(torch.nn.Linear(3, 2), name="lin", run="torch")
      root = tf.Module()
      root.module = module
      root.serve = tf.function(lambda x: module(x), input_signature=[tf.TensorSpec([2, 3])])
      own = root.serve(tf.ones([2, 3])).numpy().tolist()
      result = {{{{"own": own}}}}
      if seed == 0:
        tf.saved_model.save(root, {path!r})
      else:
        # More live callbacks of the same module, as a longer program has:
        # before ids were random, one of them had the saved op's id.
        others = [tf.function(lambda x: module(x)) for _ in range(6)]
        for other in others:
          other(tf.ones([2, 3]))
        loaded = tf.saved_model.load({path!r})
        try:
          result["loaded"] = loaded.serve(tf.ones([2, 3])).numpy().tolist()
        except Exception as err:  # pylint: disable=broad-except
          result["error"] = str(err)
      print(json.dumps(result))
      """
  env = {
    _loader.DISABLE_ENV: None,
    "TORCHBRIDGE_TORCH_RUNNER": "python" if runner == "python" else None,
  }
  saved = _run_subprocess(program.format(seed=0), env)
  result = _run_subprocess(program.format(seed=1), env)
  assert saved["own"] != result["own"]  # other weights
  assert "loaded" not in result, result
  assert "is not registered" in result["error"] and "cannot carry torch" in result["error"]


def test_the_gpu_script_uses_names_the_package_has():
  # tests/cuda_torch_side.py runs only where CUDA is (the lent GPU machines,
  # without TF): here it would print "skipped" and check nothing. Its loader
  # runs here, in a child (it replaces the `torchbridge` package), and every
  # name its checks use must exist.
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_torch_side.py")
  with open(script, encoding="utf-8") as f:
    source = f.read()
  names = sorted(set(re.findall(r"\b(?:native|exchange)\.[A-Za-z_][A-Za-z_.]*", source)))
  names = [n for n in names if n not in ("native._callbacks", "native.py")]  # prose
  assert "exchange.exchange_stats" in names and "native.dispatch" in names
  child = (
    "import functools, sys\n"
    f"sys.path.insert(0, {os.path.dirname(script)!r})\n"
    "import cuda_torch_side as script\n"
    "exchange, native = script._load_torchbridge_modules()\n"
    "spaces = {'exchange': exchange, 'native': native}\n"
    f"for name in {names!r}:\n"
    "  space, *path = name.split('.')\n"
    "  functools.reduce(getattr, path, spaces[space])\n"
    "print('names ok', exchange.exchange_stats()['copied'] >= 0)\n"
  )
  out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "names ok True" in out.stdout
