"""Tensor exchange: `tb.to_torch`, `tb.to_tf` and the exchange counters.

Zero-copy is proved by memory identity (a write through one framework is
read through the other, data pointers are compared), never by equal values.
"""

import collections
import gc
import warnings

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from conftest import requires_gpu

# Exact exchange counts: no cyclic collection mid-test (conftest).
pytestmark = pytest.mark.usefixtures("own_crossings_only", "bridge_runner")

# (TF dtype, torch dtype, a value to write in memory-identity tests).
SHARED_DTYPES = [
  (tf.float16, torch.float16, 7.5),
  (tf.bfloat16, torch.bfloat16, 7.5),
  (tf.float32, torch.float32, 7.25),
  (tf.float64, torch.float64, 7.125),
  (tf.int8, torch.int8, -7),
  (tf.int16, torch.int16, -700),
  (tf.int32, torch.int32, -70000),
  (tf.int64, torch.int64, -(2**40)),
  (tf.uint8, torch.uint8, 250),
  (tf.uint16, torch.uint16, 65000),
  (tf.uint32, torch.uint32, 2**31 + 5),
  (tf.uint64, torch.uint64, 2**40 + 5),
  (tf.bool, torch.bool, True),
  (tf.complex64, torch.complex64, 7.5 - 2.25j),
  (tf.complex128, torch.complex128, 7.125 + 3.5j),
]
DTYPE_IDS = [tf_dt.name for tf_dt, _, _ in SHARED_DTYPES]
SHAPES = [(), (0, 3), (2, 3)]
SHAPE_IDS = ["scalar", "zero_size", "matrix"]

Point = collections.namedtuple("Point", ["x", "y"])


def sample_np(tf_dtype, shape, seed=0):
  """Distinct-looking values that every dtype can hold exactly."""
  rng = np.random.default_rng(seed)
  size = int(np.prod(shape, dtype=np.int64))
  if tf_dtype == tf.bool:
    return (rng.integers(0, 2, size=size) == 1).reshape(shape)
  if tf_dtype.is_complex:
    real = rng.integers(-8, 8, size=size) / 4
    imag = rng.integers(-8, 8, size=size) / 4
    return (real + 1j * imag).astype(tf_dtype.as_numpy_dtype).reshape(shape)
  if tf_dtype.is_floating:
    values = rng.integers(-16, 16, size=size) / 4
    return values.astype(
      np.float32 if tf_dtype == tf.bfloat16 else tf_dtype.as_numpy_dtype
    ).reshape(shape)
  low = 0 if tf_dtype.is_unsigned else -100
  return rng.integers(low, 100, size=size).astype(tf_dtype.as_numpy_dtype).reshape(shape)


def tf_owned(tf_dtype, shape, seed=0):
  """A TF tensor in a buffer TF allocated (the result of a TF op)."""
  return tf.identity(tf.constant(sample_np(tf_dtype, shape, seed), dtype=tf_dtype))


def torch_owned(tf_dtype, torch_dtype, shape, seed=0):
  values = sample_np(tf_dtype, shape, seed)
  if torch_dtype == torch.bfloat16:
    return torch.from_numpy(values).to(torch.bfloat16)
  return torch.from_numpy(values).clone()


def np_of_torch(x_torch):
  """Values of a torch tensor as numpy (bfloat16 widened exactly)."""
  if x_torch.dtype == torch.bfloat16:
    return x_torch.float().numpy()
  return x_torch.numpy()


def np_of_tf(x_tf):
  values = x_tf.numpy()
  if x_tf.dtype == tf.bfloat16:
    return values.astype(np.float32)
  return np.asarray(values)


def different(old, new):
  """`new`, or for booleans the negation of `old`; asserts it differs."""
  if isinstance(old, (bool, np.bool_)):
    new = not old
  assert old != new
  return new


def ptr_of_tf(x_tf):
  """Address of a TF tensor's buffer (read through a second DLPack view)."""
  ptr = tb.to_torch(x_tf).data_ptr()
  tb.reset_exchange_stats()
  return ptr


def assert_stats(zero_copy=0, copied=0, bytes_copied=0):
  assert tb.exchange_stats() == {
    "zero_copy": zero_copy,
    "copied": copied,
    "bytes_copied": bytes_copied,
  }


# --- Round trips of every shared dtype, scalars and zero-size tensors. ---


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("tf_dtype,torch_dtype,_", SHARED_DTYPES, ids=DTYPE_IDS)
def test_tf_to_torch_round_trip(tf_dtype, torch_dtype, _, shape):
  x_tf = tf_owned(tf_dtype, shape)
  x_torch = tb.to_torch(x_tf)
  assert isinstance(x_torch, torch.Tensor)
  assert x_torch.dtype == torch_dtype
  assert tuple(x_torch.shape) == shape
  assert x_torch.device.type == "cpu"
  np.testing.assert_array_equal(np_of_torch(x_torch), np_of_tf(x_tf))

  back_tf = tb.to_tf(x_torch)
  assert isinstance(back_tf, tf.Tensor)
  assert back_tf.dtype == tf_dtype
  assert back_tf.shape == shape
  np.testing.assert_array_equal(np_of_tf(back_tf), np_of_tf(x_tf))
  assert_stats(zero_copy=2)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("tf_dtype,torch_dtype,_", SHARED_DTYPES, ids=DTYPE_IDS)
def test_torch_to_tf_round_trip(tf_dtype, torch_dtype, _, shape):
  x_torch = torch_owned(tf_dtype, torch_dtype, shape)
  x_tf = tb.to_tf(x_torch)
  assert isinstance(x_tf, tf.Tensor)
  assert x_tf.dtype == tf_dtype
  assert x_tf.shape == shape
  np.testing.assert_array_equal(np_of_tf(x_tf), np_of_torch(x_torch))
  # TF kernels can use the buffer (a misaligned one would abort here).
  np.testing.assert_array_equal(np_of_tf(tf.identity(x_tf)), np_of_torch(x_torch))

  back_torch = tb.to_torch(x_tf)
  assert back_torch.dtype == torch_dtype
  assert tuple(back_torch.shape) == shape
  if x_torch.numel():
    assert back_torch.data_ptr() == x_torch.data_ptr()
  assert_stats(zero_copy=2)


# --- Zero copy, proved by memory identity. ---


@pytest.mark.parametrize("shape", [(), (2, 3)], ids=["scalar", "matrix"])
@pytest.mark.parametrize("tf_dtype,torch_dtype,new", SHARED_DTYPES, ids=DTYPE_IDS)
def test_to_torch_shares_memory(tf_dtype, torch_dtype, new, shape):
  x_tf = tf_owned(tf_dtype, shape, seed=1)
  x_torch = tb.to_torch(x_tf)
  index = () if shape == () else (1, 2)
  new = different(np_of_tf(x_tf)[index], new)
  x_torch[index] = new
  # TF reads the value written through torch, both directly and in a kernel.
  assert np_of_tf(x_tf)[index] == new
  assert np_of_tf(tf.reshape(x_tf, [-1]))[-1] == new
  assert tb.to_torch(x_tf).data_ptr() == x_torch.data_ptr()
  assert_stats(zero_copy=2)


@pytest.mark.parametrize("shape", [(), (2, 3)], ids=["scalar", "matrix"])
@pytest.mark.parametrize("tf_dtype,torch_dtype,new", SHARED_DTYPES, ids=DTYPE_IDS)
def test_to_tf_shares_memory(tf_dtype, torch_dtype, new, shape):
  x_torch = torch_owned(tf_dtype, torch_dtype, shape, seed=2)
  x_tf = tb.to_tf(x_torch)
  index = () if shape == () else (0, 1)
  new = different(np_of_tf(x_tf)[index], new)
  x_torch[index] = new
  assert np_of_tf(x_tf)[index] == new
  assert ptr_of_tf(x_tf) == x_torch.data_ptr()
  assert_stats()


def test_to_tf_keeps_torch_memory_alive():
  x_torch = torch.randn(1000)
  expected = x_torch.numpy().copy()
  ptr = x_torch.data_ptr()
  x_tf = tb.to_tf(x_torch)
  del x_torch
  gc.collect()
  _ = torch.randn(1000) * 2  # reuse freed memory if it had been freed
  assert ptr_of_tf(x_tf) == ptr
  np.testing.assert_array_equal(x_tf.numpy(), expected)


def test_to_torch_keeps_tf_memory_alive():
  x_tf = tf_owned(tf.float32, (1000,), seed=3)
  expected = x_tf.numpy().copy()
  x_torch = tb.to_torch(x_tf)
  del x_tf
  gc.collect()
  _ = tf.random.normal([1000]) * 2
  np.testing.assert_array_equal(x_torch.numpy(), expected)


def test_variable_to_torch_views_current_value():
  v = tf.Variable(tf.identity(tf.constant([1.0, 2.0, 3.0])))
  v_torch = tb.to_torch(v)
  v_torch[0] = 9.0
  np.testing.assert_array_equal(v.numpy(), [9.0, 2.0, 3.0])
  # A later update gives the variable a new buffer; the view keeps the value
  # it had at the time of the call (documented behaviour).
  v.assign([4.0, 5.0, 6.0])
  np.testing.assert_array_equal(v_torch.numpy(), [9.0, 2.0, 3.0])
  np.testing.assert_array_equal(tb.to_torch(v).numpy(), [4.0, 5.0, 6.0])
  assert_stats(zero_copy=2)


def test_requires_grad_tensor_is_detached_and_shared():
  x_torch = torch.randn(16, requires_grad=True)
  x_tf = tb.to_tf(x_torch)
  assert ptr_of_tf(x_tf) == x_torch.data_ptr()
  with torch.no_grad():
    x_torch[3] = 42.0
  assert x_tf.numpy()[3] == 42.0


@pytest.mark.parametrize(
  "make",
  [
    lambda: torch.randn(64)[16:],  # offset of 64 bytes: still aligned
    lambda: torch.randn(8, 16)[2:5],  # whole rows at an aligned offset
    lambda: torch.randn(5).unsqueeze(0).as_strided((1, 5), (99, 1)),
    lambda: torch.randn(3, 4)[:, None, :],  # size-1 dimension, any stride
  ],
  ids=["aligned_offset", "row_slice", "size1_odd_stride", "unsqueezed"],
)
def test_aligned_views_are_shared(make):
  x_torch = make()
  x_tf = tb.to_tf(x_torch)
  assert_stats(zero_copy=1)
  assert ptr_of_tf(x_tf) == x_torch.data_ptr()
  x_torch.reshape(-1)[-1] = 123.0
  assert x_tf.numpy().reshape(-1)[-1] == 123.0


# --- The copy path: layouts TF cannot view. ---


def _misaligned(dtype):
  base = torch.arange(1025).to(dtype)
  return base, base[1:]


def _transposed(dtype):
  base = torch.arange(8 * 16).to(dtype).reshape(8, 16)
  return base, base.t()


def _stepped(dtype):
  base = torch.arange(128).to(dtype)
  return base, base[::2]


def _expanded(dtype):
  base = torch.arange(4).to(dtype).reshape(4, 1)
  return base, base.expand(4, 16)


def _column_slice(dtype):
  base = torch.arange(8 * 16).to(dtype).reshape(8, 16)
  return base, base[:, 1:]


def _misaligned_scalar(dtype):
  base = torch.arange(5).to(dtype)
  return base, base[1]


COPY_CASES = [_misaligned, _transposed, _stepped, _expanded, _column_slice, _misaligned_scalar]


@pytest.mark.parametrize(
  "dtype",
  [torch.float32, torch.float64, torch.int8, torch.bool, torch.complex128],
  ids=["float32", "float64", "int8", "bool", "complex128"],
)
@pytest.mark.parametrize("make", COPY_CASES, ids=[m.__name__[1:] for m in COPY_CASES])
def test_to_tf_copies_layouts_tf_cannot_view(make, dtype):
  base, x_torch = make(dtype)
  expected = x_torch.contiguous().numpy().copy()
  x_tf = tb.to_tf(x_torch)

  assert x_tf.dtype == tb.to_tf(torch.zeros(0, dtype=dtype)).dtype
  np.testing.assert_array_equal(x_tf.numpy(), expected)
  nbytes = x_torch.numel() * x_torch.element_size()
  assert_stats(zero_copy=1, copied=1, bytes_copied=nbytes)

  # The copy is aligned, so TF kernels can run on it (a misaligned buffer
  # would abort the process in the next op).
  copy_ptr = ptr_of_tf(x_tf)
  assert copy_ptr % 64 == 0
  assert copy_ptr != x_torch.data_ptr()
  np.testing.assert_array_equal(tf.reshape(x_tf, [-1]).numpy(), expected.reshape(-1))
  # It does not share memory with the source.
  base.zero_() if dtype != torch.bool else base.logical_not_()
  np.testing.assert_array_equal(x_tf.numpy(), expected)


def test_misaligned_float_view_from_issue():
  x_torch = torch.randn(1025)[1:]
  assert x_torch.data_ptr() % 64 != 0
  x_tf = tb.to_tf(x_torch)
  assert_stats(copied=1, bytes_copied=1024 * 4)
  # Before the fix for this kind of view, this op aborted the process.
  np.testing.assert_allclose(tf.reduce_sum(x_tf).numpy(), x_torch.sum().item(), rtol=1e-5)
  np.testing.assert_allclose(
    tf.matmul(tf.reshape(x_tf, [32, 32]), tf.eye(32)).numpy(), x_torch.reshape(32, 32).numpy()
  )


def test_lazy_conjugate_view_is_resolved_and_copied():
  x_torch = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
  x_conj = x_torch.conj()
  assert x_conj.is_conj()
  x_tf = tb.to_tf(x_conj)
  np.testing.assert_array_equal(x_tf.numpy(), [1 - 2j, 3 + 4j])
  assert_stats(copied=1, bytes_copied=16)
  assert ptr_of_tf(x_tf) != x_torch.data_ptr()


def test_lazy_negative_view_is_resolved_and_copied():
  x_torch = torch.tensor([1.0, -2.0, 3.0])
  x_neg = torch._neg_view(x_torch)
  assert x_neg.is_neg()
  x_tf = tb.to_tf(x_neg)
  np.testing.assert_array_equal(x_tf.numpy(), [-1.0, 2.0, -3.0])
  assert_stats(copied=1, bytes_copied=12)


# --- numpy arrays. ---


def aligned_np(n, dtype=np.float32, offset=0):
  """A writable numpy array starting `offset` bytes past a 64-byte boundary."""
  itemsize = np.dtype(dtype).itemsize
  raw = np.zeros(n * itemsize + 128, dtype=np.uint8)
  start = (-raw.ctypes.data) % 64 + offset
  return raw[start : start + n * itemsize].view(dtype)


def test_numpy_to_torch_shares_memory():
  x_np = np.arange(6, dtype=np.float64).reshape(2, 3)
  x_torch = tb.to_torch(x_np)
  assert x_torch.data_ptr() == x_np.ctypes.data
  x_np[1, 2] = -5.0
  assert x_torch[1, 2].item() == -5.0
  assert_stats(zero_copy=1)


def test_aligned_numpy_to_tf_shares_memory():
  x_np = aligned_np(32)
  x_np[:] = np.arange(32)
  x_tf = tb.to_tf(x_np)
  assert ptr_of_tf(x_tf) == x_np.ctypes.data
  x_np[5] = 99.0
  assert x_tf.numpy()[5] == 99.0


def test_misaligned_numpy_to_tf_is_copied():
  x_np = aligned_np(32, offset=4)
  x_np[:] = np.arange(32)
  x_tf = tb.to_tf(x_np)
  np.testing.assert_array_equal(tf.identity(x_tf).numpy(), np.arange(32))
  assert_stats(copied=1, bytes_copied=32 * 4)
  x_np[5] = 99.0
  assert x_tf.numpy()[5] == 5.0


@pytest.mark.parametrize("convert", [tb.to_torch, tb.to_tf], ids=["to_torch", "to_tf"])
def test_negatively_strided_numpy_is_copied(convert):
  base = np.arange(10, dtype=np.float64)
  x_np = base[::-1]
  result = convert(x_np)
  values = result.numpy()
  np.testing.assert_array_equal(values, np.arange(9, -1, -1))
  assert_stats(copied=1, bytes_copied=80)
  base[:] = 0.0
  np.testing.assert_array_equal(result.numpy(), np.arange(9, -1, -1))


@pytest.mark.parametrize("convert", [tb.to_torch, tb.to_tf], ids=["to_torch", "to_tf"])
def test_read_only_numpy_is_copied(convert):
  x_np = np.arange(8, dtype=np.int32)
  x_np.flags.writeable = False
  result = convert(x_np)
  np.testing.assert_array_equal(result.numpy(), np.arange(8))
  assert_stats(copied=1, bytes_copied=32)
  if convert is tb.to_torch:
    result[0] = 7  # a private copy: writing does not touch the read-only array
    assert x_np[0] == 0


# --- Nested structures. ---


def test_to_torch_keeps_nest_and_static_leaves():
  marker = object()
  t_static = torch.ones(2)
  x_tf = tf_owned(tf.float32, (2, 3))
  i_tf = tf_owned(tf.int64, (4,))
  nest = {
    "pair": (x_tf, [i_tf, 3.5]),
    "point": Point(x=x_tf, y="label"),
    "misc": [None, marker, t_static],
  }
  out = tb.to_torch(nest)
  assert set(out) == {"pair", "point", "misc"}
  assert type(out["pair"]) is tuple and type(out["pair"][1]) is list
  assert type(out["point"]) is Point
  assert out["pair"][0].data_ptr() == out["point"].x.data_ptr()
  assert out["pair"][1][0].dtype == torch.int64
  np.testing.assert_array_equal(out["pair"][1][0].numpy(), i_tf.numpy())
  assert out["pair"][1][1] == 3.5
  assert out["point"].y == "label"
  assert out["misc"][0] is None and out["misc"][1] is marker
  assert out["misc"][2] is t_static  # torch tensors pass through
  assert_stats(zero_copy=3)


def test_to_tf_keeps_nest_and_static_leaves():
  a_torch = torch.randn(3, 2)
  b_torch = torch.arange(5)
  c_tf = tf.constant([1.0])
  nest = [Point(x=a_torch, y={"b": b_torch, "n": 4}), (c_tf, "s", None)]
  out = tb.to_tf(nest)
  assert type(out) is list and type(out[0]) is Point and type(out[1]) is tuple
  assert isinstance(out[0].x, tf.Tensor) and out[0].x.dtype == tf.float32
  assert out[0].y["b"].dtype == tf.int64
  assert out[0].y["n"] == 4
  assert out[1][0] is c_tf  # TF tensors pass through
  assert out[1][1] == "s" and out[1][2] is None
  assert ptr_of_tf(out[0].x) == a_torch.data_ptr()
  np.testing.assert_array_equal(out[0].y["b"].numpy(), np.arange(5))


def test_nested_round_trip_mixed_copy_and_share():
  shared = torch.randn(4, 4)
  strided = torch.randn(4, 4).t()
  out = tb.to_tf({"shared": shared, "strided": strided})
  assert_stats(zero_copy=1, copied=1, bytes_copied=64)
  assert ptr_of_tf(out["shared"]) == shared.data_ptr()
  np.testing.assert_array_equal(out["strided"].numpy(), strided.contiguous().numpy())


# --- Counters. ---


def test_exchange_stats_count_and_reset():
  assert_stats()
  tb.to_torch([tf.ones([2]), tf.ones([3]), 5])
  tb.to_tf(torch.randn(9)[1:])
  assert_stats(zero_copy=2, copied=1, bytes_copied=32)
  stats = tb.exchange_stats()
  stats["zero_copy"] = 1000  # a copy: changing it changes nothing
  assert tb.exchange_stats()["zero_copy"] == 2
  tb.reset_exchange_stats()
  assert_stats()
  tb.to_tf(torch.randn(4))
  assert_stats(zero_copy=1)


# --- Unsupported kinds: a TypeError naming the kind and the way out. ---


def _ragged():
  return tf.ragged.constant([[1.0, 2.0], [3.0]])


def _sparse():
  return tf.sparse.SparseTensor([[0, 1]], [1.0], [2, 3])


def _indexed_slices():
  return tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), tf.constant([2, 3]))


@pytest.mark.parametrize(
  "make,kind,fix",
  [
    (_ragged, "tf.RaggedTensor", "x.to_tensor()"),
    (_sparse, "tf.SparseTensor", "tf.sparse.to_dense(x)"),
    (_indexed_slices, "tf.IndexedSlices", "tf.convert_to_tensor(x)"),
    (lambda: tf.constant(["a", "bc"]), "dtype string", "tf.strings.to_number"),
    (lambda: tf.constant("scalar"), "dtype string", "tf.strings.to_number"),
    (lambda: tf.Variable(["a"]), "dtype string", "tf.strings.to_number"),
    (
      lambda: {"ok": tf.ones([2]), "bad": [tf.constant(["s"])]},
      "dtype string",
      "tf.strings.to_number",
    ),
    (lambda: np.array(["a", "b"]), "numpy array of dtype <U1", "astype"),
    (lambda: np.array([object()], dtype=object), "numpy array of dtype object", "astype"),
  ],
  ids=[
    "ragged",
    "sparse",
    "indexed_slices",
    "string",
    "string_scalar",
    "string_variable",
    "nested_string",
    "numpy_str",
    "numpy_object",
  ],
)
def test_to_torch_rejects_unsupported_kinds(make, kind, fix):
  with pytest.raises(TypeError) as info:
    tb.to_torch(make())
  message = str(info.value)
  assert "to_torch()" in message
  assert kind in message
  assert fix in message
  # The process is intact: TF and the exchange still work.
  np.testing.assert_array_equal(tb.to_torch(tf.ones([2]) * 3).numpy(), [3, 3])


def _quantized():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)


def _sparse_csr():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return torch.eye(3).to_sparse_csr()


def _complex32():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return torch.zeros(3, dtype=torch.complex32)


@pytest.mark.parametrize(
  "make,kind,fix",
  [
    (lambda: torch.eye(3).to_sparse(), "sparse torch tensor", "x.to_dense()"),
    (_sparse_csr, "sparse torch tensor", "x.to_dense()"),
    (_quantized, "quantized torch tensor", "x.dequantize()"),
    (lambda: torch.empty(2, 3, device="meta"), "meta torch tensor", "device='cpu'"),
    (_complex32, "torch.complex32, which TF lacks", "x.to(torch.float32)"),
    (
      lambda: torch.zeros(3).to(torch.float8_e4m3fn),
      "torch.float8_e4m3fn, which TF lacks",
      "x.to(torch.float32)",
    ),
    (
      lambda: (torch.ones(2), {"k": torch.zeros(3).to(torch.float8_e5m2)}),
      "torch.float8_e5m2, which TF lacks",
      "x.to(torch.float32)",
    ),
    (lambda: np.array(["a"]), "numpy array of dtype <U1", "astype"),
  ],
  ids=[
    "sparse_coo",
    "sparse_csr",
    "quantized",
    "meta",
    "complex32",
    "float8",
    "nested_float8",
    "numpy_str",
  ],
)
def test_to_tf_rejects_unsupported_kinds(make, kind, fix):
  with pytest.raises(TypeError) as info:
    tb.to_tf(make())
  message = str(info.value)
  assert "to_tf()" in message
  assert kind in message
  assert fix in message
  np.testing.assert_array_equal(tb.to_tf(torch.ones(2) * 3).numpy(), [3, 3])


def test_to_torch_rejects_symbolic_tensor_in_tf_function():
  seen = []

  @tf.function
  def traced(x):
    try:
      tb.to_torch(x)
    except TypeError as err:
      seen.append(str(err))
    return x + 1

  np.testing.assert_array_equal(traced(tf.ones([2])).numpy(), [2.0, 2.0])
  assert len(seen) == 1
  assert "symbolic tensor" in seen[0]
  assert "tf.function" in seen[0]
  assert "tb.torch_function" in seen[0]


# --- GPU: the same device, zero-copy, streams ordered. ---


@requires_gpu
def test_gpu_to_torch_shares_device_memory():
  with tf.device("GPU:0"):
    x_tf = tf.identity(tf.random.normal([1024]))
  x_torch = tb.to_torch(x_tf)
  assert x_torch.is_cuda
  x_torch[7] = 42.0
  torch.cuda.synchronize()
  assert x_tf.numpy()[7] == 42.0
  assert_stats(zero_copy=1)


@requires_gpu
def test_gpu_to_tf_shares_device_memory_and_orders_streams():
  a_torch = torch.randn(2048, 2048, device="cuda", dtype=torch.float64)
  # Queued on torch's stream and still running when to_tf returns unless
  # to_tf waits for it.
  y_torch = a_torch @ a_torch
  y_tf = tb.to_tf(y_torch)
  assert "GPU" in y_tf.device
  assert ptr_of_tf(y_tf) == y_torch.data_ptr()
  expected = (a_torch.cpu() @ a_torch.cpu()).numpy()
  np.testing.assert_allclose(tf.reduce_sum(y_tf, axis=0).numpy(), expected.sum(axis=0), rtol=1e-9)


def test_exact_counts_hold_while_an_earlier_wrapper_awaits_collection():
  # A wrapper left in a reference cycle, as an earlier test may leave one:
  # collected, it copies its torch module's values back (two counted
  # copies). The module's `own_crossings_only` keeps that out of the test.
  assert not gc.isenabled()
  wrapper = tb.TorchModule(torch.nn.Linear(2, 2), name="left_behind")
  cycle = [wrapper]
  cycle.append(cycle)
  del wrapper, cycle
  tb.reset_exchange_stats()
  for _ in range(20_000):  # allocations that would start collections
    _ = [[], {}]
  tb.to_torch(tf.ones([2]))
  assert_stats(zero_copy=1)
  gc.collect()  # an explicit collection still runs, and counts the copies
  assert_stats(zero_copy=1, copied=2, bytes_copied=(4 + 2) * 4)
