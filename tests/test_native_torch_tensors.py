"""Tests for the native op's torch_tensors mode (csrc/torch_interop.cc).

In this mode the kernel hands Python torch tensors and adopts the torch
tensors it returns, converting both ways in C++; outputs TF cannot use as
they are take one counted copy in Python. Skipped where the native op is not
in use; the fallback (a library built without torch_interop.cc, where
`torch_callback` converts in Python) is tested in a subprocess.
"""

import gc
import os
import weakref

import numpy as np
import pytest
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _loader
from torchbridge._native import _op
from torchbridge._native import _build

from test_native import _data_ptr
from test_native import check_from_eight_threads
from test_native_loader import _run_subprocess

# Exact exchange counts: no cyclic collection mid-test (conftest).
pytestmark = pytest.mark.usefixtures("own_crossings_only")

if os.environ.get(_loader.DISABLE_ENV, "").strip() not in ("", "0") or (not _loader.available()):
  pytest.skip(f"native op not available: {_loader.status()}", allow_module_level=True)


def _torch_op(callback, inputs, dtypes, shapes, **kwargs):
  return _op.call(callback, inputs, dtypes, shapes, torch_tensors=True, **kwargs)


def test_this_machine_builds_the_torch_interop():
  # CI's machines have torch's headers: the fast path is what is tested.
  assert _loader.has_torch_interop(), _loader.status()
  assert "torch tensors made in C++" in _loader.status()


def test_inputs_and_outputs_share_memory_with_tf():
  seen = {}

  def callback(args, unused):
    (x,) = args
    seen.update(type=type(x), input_ptr=x.data_ptr(), unused=unused)
    y = x * 2 + 1
    seen["output"] = y
    return [y]

  @tf.function
  def f(x):
    return _torch_op(callback, [x], [tf.float32], [x.shape])[0]

  x_tf = tf.random.normal([16, 5])
  y_tf = f(x_tf)
  np.testing.assert_allclose(y_tf.numpy(), x_tf.numpy() * 2 + 1, rtol=1e-6)
  assert seen["type"] is torch.Tensor
  assert seen["unused"] is None  # the graph consumes the output
  assert seen["input_ptr"] == _data_ptr(x_tf)
  # Writing through torch's output changes TF's: one buffer, not a copy.
  assert _data_ptr(y_tf) == seen["output"].data_ptr()
  seen["output"].fill_(-3.0)
  np.testing.assert_array_equal(y_tf.numpy(), np.full([16, 5], -3.0))


def test_input_views_write_through_to_tf():
  # The torch input is TF's buffer itself: a write shows in the TF tensor
  # (the bridge forbids this to user code; here it proves the sharing).
  def callback(args, unused):
    del unused
    args[0][0] = 42.0
    return [args[0] * 0]

  x_tf = tf.constant([1.0, 2.0, 3.0]) + 0.0  # a buffer of its own
  f = tf.function(lambda x: _torch_op(callback, [x], [tf.float32], [[3]])[0])
  f(x_tf)
  assert x_tf.numpy()[0] == 42.0


def test_outputs_tf_cannot_view_are_copied_once_and_counted():
  # The sources of the outputs TF cannot use as they are: a view 4 bytes
  # into its storage (not 64-byte aligned), a transposed view, and a lazily
  # conjugated one. Each copy must hold exactly its source's values.
  misaligned_source = torch.arange(1025, dtype=torch.float32)
  transposed_source = torch.arange(32, dtype=torch.float32).reshape(8, 4)
  conj_source = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j], dtype=torch.complex64)

  def callback(args, unused):
    del unused
    return [args[0] * 2, misaligned_source[1:], transposed_source.t(), conj_source.conj()]

  @tf.function
  def f(x):
    return _torch_op(
      callback, [x], [tf.float32] * 3 + [tf.complex64], [x.shape, [1024], [4, 8], [3]]
    )

  tb.reset_exchange_stats()
  a, b, c, d = f(tf.ones([5]))
  np.testing.assert_array_equal(a.numpy(), [2.0] * 5)
  assert b.shape == (1024,) and c.shape == (4, 8)
  np.testing.assert_array_equal(b.numpy(), np.arange(1, 1025))
  np.testing.assert_array_equal(c.numpy(), np.arange(32).reshape(8, 4).T)
  np.testing.assert_array_equal(d.numpy(), np.array([1 - 2j, 3 + 1j, -2 - 0.5j], np.complex64))
  stats = tb.exchange_stats()
  assert stats["zero_copy"] == 2  # the input and the first output
  assert stats["copied"] == 3
  assert stats["bytes_copied"] == 1024 * 4 + 32 * 4 + 3 * 8
  tb.reset_exchange_stats()
  assert tb.exchange_stats()["zero_copy"] == 0


def test_an_output_holds_only_memory_unless_asked_to_hold_the_tensor():
  # By default TF keeps the output's memory alive, not torch's Python
  # object; with whole_tensor_outputs it keeps the tensor (and what is set
  # on it) as long as TF holds the buffer, as torch's DLPack export does.
  freed = []

  def callback(args, unused):
    del unused
    y = args[0] + 1
    y.note = "kept"
    weakref.finalize(y, freed.append, 1)
    return [y]

  plain = tf.function(lambda x: _torch_op(callback, [x], [tf.float32], [[4]])[0])
  whole = tf.function(
    lambda x: _torch_op(callback, [x], [tf.float32], [[4]], whole_tensor_outputs=[0])[0]
  )
  x_tf = tf.zeros([4])
  y_tf = plain(x_tf)
  gc.collect()
  assert freed == [1]  # the Python object is gone, the memory is not
  np.testing.assert_array_equal(y_tf.numpy(), np.ones(4))
  z_tf = whole(x_tf)
  gc.collect()
  assert freed == [1]
  del z_tf
  gc.collect()
  assert freed == [1, 1]
  del y_tf


@pytest.mark.parametrize(
  "make,error,pattern",
  [
    (
      lambda: [torch.zeros(4, dtype=torch.float64)],
      tf.errors.InvalidArgumentError,
      "has dtype float64, but float was declared",
    ),
    (
      lambda: [torch.zeros(5)],
      tf.errors.InvalidArgumentError,
      "has shape [5], but [4] was declared",
    ),
    (
      lambda: [3.0],
      tf.errors.InvalidArgumentError,
      "output 0 of the torch callback is a float, not a torch.Tensor",
    ),
    (
      lambda: [None],
      tf.errors.InvalidArgumentError,
      "output 0 of the torch callback is None, but the graph uses it",
    ),
    (
      lambda: [torch.zeros(4), torch.zeros(4)],
      tf.errors.InvalidArgumentError,
      "returned 2 tensors, but 1 outputs were declared",
    ),
    (lambda: torch.zeros(4), tf.errors.InvalidArgumentError, "must return a list of torch tensors"),
    (lambda: [torch.zeros(4).to_sparse()], tf.errors.InvalidArgumentError, "sparse torch tensor"),
  ],
)
def test_bad_outputs_give_clear_errors_and_the_op_goes_on(make, error, pattern):
  f = tf.function(
    lambda x: _torch_op(lambda args, unused: make(), [x], [tf.float32], [[4]])[0] + 1.0
  )
  with pytest.raises(error) as info:
    f(tf.zeros([4]))
  assert pattern in info.value.message
  assert "TorchbridgeCall" in info.value.message
  good = tf.function(
    lambda x: _torch_op(lambda args, unused: [args[0] + 1], [x], [tf.float32], [[4]])[0]
  )
  np.testing.assert_array_equal(good(tf.zeros([4])).numpy(), np.ones(4))


def test_whole_tensor_output_index_out_of_range_is_a_clear_error():
  f = tf.function(
    lambda x: _torch_op(
      lambda args, unused: [args[0]], [x], [tf.float32], [[2]], whole_tensor_outputs=[3]
    )[0]
  )
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="whole_tensor_outputs index 3 out of range for 1 outputs"
  ):
    f(tf.ones([2]))


def test_python_exception_keeps_its_message_and_the_process_goes_on():
  calls = []

  def callback(args, unused):
    del unused
    calls.append(1)
    if len(calls) == 1:
      raise ValueError("torch said no: bad value 42")
    return [args[0]]

  f = tf.function(lambda x: _torch_op(callback, [x], [tf.float32], [[2]])[0])
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    f(tf.ones([2]))
  assert "torch said no: bad value 42" in info.value.message
  assert "Traceback (most recent call last)" in info.value.message
  np.testing.assert_array_equal(f(tf.ones([2])).numpy(), [1.0, 1.0])


def test_unused_outputs_are_passed_and_may_be_none():
  seen = []

  def callback(args, unused):
    seen.append(unused)
    x = args[0]
    return [None if unused and 0 in unused else x + 1, x * 2]

  def two(x):
    return _torch_op(callback, [x], [tf.float32, tf.float32], [x.shape, x.shape])

  only_second = tf.function(lambda x: two(x)[1])
  both = tf.function(lambda x: tf.add_n(two(x)))
  x_tf = tf.constant([1.0, 2.0])
  np.testing.assert_array_equal(only_second(x_tf), [2.0, 4.0])
  np.testing.assert_array_equal(both(x_tf), [4.0, 7.0])
  assert seen == [(0,), None]


def test_dtypes_round_trip_zero_copy():
  seen = {}

  def identity(args, unused):
    del unused
    seen["ptr"] = args[0].data_ptr()
    return [args[0]]

  for dtype in (
    tf.float16,
    tf.bfloat16,
    tf.float64,
    tf.int8,
    tf.int32,
    tf.int64,
    tf.uint8,
    tf.bool,
    tf.complex128,
  ):
    x_tf = tf.cast(tf.reshape(tf.range(12), [3, 4]) % 2, dtype)
    f = tf.function(lambda x: _torch_op(identity, [x], [x.dtype], [x.shape])[0])
    seen.clear()
    tb.reset_exchange_stats()
    y_tf = f(x_tf)
    assert y_tf.dtype == dtype
    np.testing.assert_array_equal(y_tf.numpy(), x_tf.numpy())
    # Zero copy by memory identity: torch got TF's input buffer, and TF's
    # output is that same buffer handed back.
    assert seen["ptr"] == _data_ptr(x_tf), dtype
    assert _data_ptr(y_tf) == _data_ptr(x_tf), dtype
    assert tb.exchange_stats() == {"zero_copy": 2, "copied": 0, "bytes_copied": 0}, dtype


def test_concurrent_calls_from_eight_threads():
  def callback(args, unused):
    del unused
    x, k = args
    return [torch.tanh(x) * k + k]

  @tf.function
  def f(x, k):
    return _torch_op(callback, [x, k], [tf.float32], [x.shape])[0]

  check_from_eight_threads(f)


def test_outputs_dying_inside_the_graph_free_their_memory():
  # Outputs consumed inside the graph are released on TF's threads, without
  # the GIL (only the storage is held): the memory must still go back.
  made, freed = [], []

  def callback(args, unused):
    del unused
    y = args[0] + 1
    made.append(1)
    weakref.finalize(y.untyped_storage(), freed.append, 1)
    return [y]

  @tf.function
  def internal(x):
    return tf.reduce_sum(_torch_op(callback, [x], [tf.float32], [x.shape])[0])

  x_tf = tf.zeros([1000])
  for _ in range(100):
    internal(x_tf)
  gc.collect()
  assert len(made) == 100
  assert len(freed) == 100


@pytest.mark.slow  # it builds the op a second time (about 25 s)
def test_library_without_torch_interop_still_serves_torch_tensors(tmp_path):
  # Where torch_interop.cc does not build, the loader builds the op without
  # it, and torch_tensors callbacks run through torch_callback in Python.
  result = _run_subprocess(
    """
      # torch_interop.cc's own flags now make its compilation fail.
      _compiler.torch_interop_flags = lambda sources: (
          ["-include", "/nonexistent/header.h"], [])
      import numpy as np
      import torchbridge as tb
      ok = _loader.available()
      f = tf.function(lambda x: _op.call(
          lambda args, unused: [args[0] * 3], [x], [tf.float32], [[2]],
          torch_tensors=True)[0])
      g = tf.function(tb.torch_function(lambda x: x.sin()))
      x = tf.constant([1.0, 2.0])
      print(json.dumps({"available": ok, "interop": _loader.has_torch_interop(),
                        "status": _loader.status(), "records": records,
                        "f": f(x).numpy().tolist(),
                        "g": g(x).numpy().tolist()}))
      """,
    {_loader.DISABLE_ENV: None, _build.CACHE_ENV: str(tmp_path)},
    timeout=600,
  )
  assert result["available"] is True
  assert result["interop"] is False
  assert "without its torch side" in result["status"]
  # The fallback says so once, at WARNING, with the reason and the log.
  warnings = [r for r in result["records"] if r[0] == "WARNING"]
  assert len(warnings) == 1, result["records"]
  message = warnings[0][1]
  assert "torch_interop.cc" in message and "nonexistent/header.h" in message
  assert str(tmp_path) in message and ".log" in message
  assert "python -m torchbridge build --force" in message
  # A later process loads the cached fallback without building, and says
  # why again (once): nothing about the op it gets is silent.
  later = _run_subprocess(
    """
      _compiler.torch_interop_flags = lambda sources: (
          ["-include", "/nonexistent/header.h"], [])
      ok = _loader.available() and _loader.available()
      print(json.dumps({"available": ok, "records": records,
                        "builds": _build.build_count}))
      """,
    {_loader.DISABLE_ENV: None, _build.CACHE_ENV: str(tmp_path)},
  )
  assert later["available"] is True and later["builds"] == 0
  assert later["records"] == warnings, later["records"]
  assert result["f"] == [3.0, 6.0]
  np.testing.assert_allclose(result["g"], np.sin([1.0, 2.0]), rtol=1e-6)
  assert list(tmp_path.glob("*.log"))  # the failed attempt's log stays
