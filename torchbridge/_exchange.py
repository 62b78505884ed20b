"""Zero-copy tensor exchange between TensorFlow and PyTorch through DLPack."""

import threading

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import torch.utils.dlpack as torch_dlpack
import tensorflow as tf

# TF's CPU kernels assume EIGEN_MAX_ALIGN_BYTES=64. TF accepts a misaligned
# DLPack buffer without complaint and a later kernel aborts the whole process
# (`Check failed: IsAligned()`), so every buffer handed to TF is checked here.
TF_ALIGNMENT = 64

# Dtypes that DLPack carries between the two frameworks (measured on TF 2.21 /
# torch 2.13: every one round-trips without a copy).
_TORCH_DTYPE_FROM_TF = {
    tf.float16: torch.float16,
    tf.bfloat16: torch.bfloat16,
    tf.float32: torch.float32,
    tf.float64: torch.float64,
    tf.int8: torch.int8,
    tf.int16: torch.int16,
    tf.int32: torch.int32,
    tf.int64: torch.int64,
    tf.uint8: torch.uint8,
    tf.uint16: torch.uint16,
    tf.uint32: torch.uint32,
    tf.uint64: torch.uint64,
    tf.bool: torch.bool,
    tf.complex64: torch.complex64,
    tf.complex128: torch.complex128,
}
_TF_DTYPE_FROM_TORCH = {v: k for k, v in _TORCH_DTYPE_FROM_TF.items()}

_UNSUPPORTED_TF_KINDS = (
    (tf.RaggedTensor, "tf.RaggedTensor",
     "convert it to a dense tensor first (`x.to_tensor()`), or pass "
     "`x.flat_values` and `x.row_splits` as separate tensors"),
    (tf.SparseTensor, "tf.SparseTensor",
     "convert it to a dense tensor first (`tf.sparse.to_dense(x)`), or pass "
     "`x.indices`, `x.values` and `x.dense_shape` as separate tensors"),
    (tf.IndexedSlices, "tf.IndexedSlices",
     "convert it to a dense tensor first (`tf.convert_to_tensor(x)`)"),
)

_stats_lock = threading.Lock()
_stats = {"zero_copy": 0, "copied": 0, "bytes_copied": 0}
# Counters kept outside Python (the native op's C++ crossings): callables
# returning a running count, and their sum at the last reset.
_zero_copy_sources = []
_zero_copy_baseline = 0


def exchange_stats():
  """Returns how many tensors crossed the boundary, and how.

  Every tensor handed from one framework to the other is counted once: as
  `zero_copy` when both sides share its memory, as `copied` (with its size in
  `bytes_copied`) when the memory did not allow sharing (misaligned views,
  non-contiguous or negatively strided layouts, read-only numpy buffers).

  Returns:
    A new dict `{"zero_copy": int, "copied": int, "bytes_copied": int}`.

  Example:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> tb.reset_exchange_stats()
    >>> _ = tb.to_torch(tf.ones([4]))
    >>> tb.exchange_stats()
    {'zero_copy': 1, 'copied': 0, 'bytes_copied': 0}
  """
  with _stats_lock:
    stats = dict(_stats)
    stats["zero_copy"] += _external_zero_copy()
    return stats


def reset_exchange_stats():
  """Sets every counter of `exchange_stats()` back to zero."""
  global _zero_copy_baseline
  with _stats_lock:
    for key in _stats:
      _stats[key] = 0
    _zero_copy_baseline += _external_zero_copy()


def add_zero_copy_source(count):
  """Adds `count() -> int`, a running count of zero-copy crossings made
  outside Python, to `exchange_stats()` from now on."""
  global _zero_copy_baseline
  with _stats_lock:
    _zero_copy_sources.append(count)
    _zero_copy_baseline += count()


def _external_zero_copy():
  return sum(count() for count in _zero_copy_sources) - _zero_copy_baseline


def count_zero_copy(n):
  """Counts `n` tensors that crossed without a copy (made outside this file)."""
  with _stats_lock:
    _stats["zero_copy"] += n


def _count(copied_bytes=None):
  with _stats_lock:
    if copied_bytes is None:
      _stats["zero_copy"] += 1
    else:
      _stats["copied"] += 1
      _stats["bytes_copied"] += copied_bytes


def to_torch(structure):
  """Hands TF tensors to torch, sharing their memory.

  Every `tf.Tensor`, `tf.Variable` (its current value) and `np.ndarray` in
  `structure` becomes a `torch.Tensor` on the same device; tuples, lists,
  dicts and namedtuples keep their shape; any other leaf (numbers, strings,
  None, torch tensors) is returned as it is. The torch tensor is a view of the
  TF buffer: nothing is copied. A view of a `tf.Variable` shows its value at
  the time of the call; a later update of the variable gives the variable a
  new buffer and the view keeps the old value.

  Args:
    structure: a tensor or a nest of tensors.

  Returns:
    The same nest with torch tensors in place of TF tensors.

  Raises:
    TypeError: for kinds torch cannot share (ragged, sparse, string,
      symbolic tensors inside `tf.function`).

  Example:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> out = tb.to_torch({"obs": tf.ones([2, 3]), "step": 7})
    >>> out["obs"].shape, out["step"]
    (torch.Size([2, 3]), 7)
  """
  return tf.nest.map_structure(_leaf_to_torch, structure)


def to_tf(structure):
  """Hands torch tensors to TF, sharing their memory where it allows.

  Every `torch.Tensor` and `np.ndarray` in `structure` becomes a `tf.Tensor`
  on the same device; tuples, lists, dicts and namedtuples keep their shape;
  any other leaf (numbers, strings, None, TF tensors) is returned as it is.
  Tensors that require grad are detached. The memory is shared whenever TF
  can use it as it is: contiguous and 64-byte aligned. Otherwise (a
  transposed or sliced view, a misaligned offset) one copy is made into an
  aligned buffer and counted in `exchange_stats()`.

  On a GPU, the work queued on torch's current stream is finished before TF
  sees the buffer, since TF's DLPack import does no synchronization.

  Args:
    structure: a tensor or a nest of tensors.

  Returns:
    The same nest with TF tensors in place of torch tensors.

  Raises:
    TypeError: for kinds TF cannot hold (sparse, quantized, meta tensors,
      dtypes TF lacks).

  Example:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> tb.to_tf((torch.zeros(2), torch.ones(3, dtype=torch.int64)))[1].dtype
    tf.int64
  """
  return tf.nest.map_structure(_leaf_to_tf, structure)


def torch_dtype(dtype_tf):
  """The torch dtype of a TF dtype (KeyError where torch has none)."""
  return _TORCH_DTYPE_FROM_TF[tf.as_dtype(dtype_tf)]


def tf_dtype(dtype_torch):
  """The TF dtype of a torch dtype (KeyError where TF has none)."""
  return _TF_DTYPE_FROM_TORCH[dtype_torch]


def has_torch_dtype(dtype_tf):
  """Whether torch has a dtype for this TF dtype."""
  return tf.as_dtype(dtype_tf) in _TORCH_DTYPE_FROM_TF


def has_tf_dtype(dtype_torch):
  """Whether TF has a dtype for this torch dtype."""
  return dtype_torch in _TF_DTYPE_FROM_TORCH


def is_tf_tensor(value):
  """True for values that `to_torch` turns into torch tensors."""
  return isinstance(value, (tf.Tensor, tf.Variable, np.ndarray))


def check_tf_leaf(value, func_name):
  """Raises a `TypeError` for TF tensor kinds that cannot cross."""
  for kind, kind_name, fix in _UNSUPPORTED_TF_KINDS:
    if isinstance(value, kind):
      raise TypeError(
          f"{func_name} received a {kind_name} (dtype {value.dtype}, shape "
          f"{value.shape}); torchbridge exchanges dense tensors only. "
          f"To pass it, {fix}.")


def _leaf_to_torch(value):
  check_tf_leaf(value, "to_torch()")
  if isinstance(value, np.ndarray):
    return _numpy_to_torch(value, "to_torch()")[0]
  if isinstance(value, tf.Variable):
    value = value.value()
  if not isinstance(value, tf.Tensor):
    return value
  return tensor_to_torch(value)


def tensor_to_torch(x_tf):
  """One dense eager TF tensor to a torch view of its buffer."""
  if tf.is_symbolic_tensor(x_tf):
    raise TypeError(
        f"to_torch() received a symbolic tensor {x_tf!r} (inside a "
        "tf.function or a graph); torch can only read tensors that hold "
        "values. To run torch code on it inside tf.function, wrap that code "
        "in `tb.torch_function` or call a `tb.TorchModule`.")
  x_torch_dtype = _TORCH_DTYPE_FROM_TF.get(x_tf.dtype)
  if x_torch_dtype is None:
    # Checked before exporting: TF's DLPack export of a tf.string tensor
    # aborts the process (`Check failed: DataTypeCanUseMemcpy`).
    raise TypeError(
        f"to_torch() received a tensor of dtype {x_tf.dtype.name} "
        f"(shape {x_tf.shape}); torch has no such dtype. Supported dtypes: "
        f"{_dtype_names(_TORCH_DTYPE_FROM_TF)}. Convert it first, e.g. "
        "`tf.strings.to_number(x)` for strings or `tf.cast(x, tf.float32)`.")
  # The capsule functions, not `torch.from_dlpack(x_tf)`: the protocol path
  # passes a `stream` for CUDA producers, which EagerTensor.__dlpack__
  # rejects; TF's capsule export synchronizes its device before returning.
  x_torch = torch_dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(x_tf))
  _count()
  return x_torch


def _numpy_to_torch(x_np, func_name, count=True):
  """A numpy array to torch, sharing memory where torch can.

  Returns the torch tensor and whether it is a copy.
  """
  has_negative_stride = any(s < 0 for s in x_np.strides)
  # torch cannot view negative strides, and a read-only buffer must not
  # become a writable torch tensor: those are copied.
  shareable = x_np.flags.writeable and not has_negative_stride
  try:
    x_torch = torch.from_numpy(
        x_np if shareable else np.array(x_np, copy=True, order="C"))
  except TypeError as err:
    raise TypeError(
        f"{func_name} received a numpy array of dtype {x_np.dtype} "
        f"(shape {x_np.shape}), which torch cannot hold. Convert it to a "
        "numeric dtype first, e.g. `x.astype(np.float32)`.") from err
  if count:
    _count(None if shareable else x_torch.numel() * x_torch.element_size())
  return x_torch, not shareable


def _leaf_to_tf(value):
  if isinstance(value, np.ndarray):
    value, copied = _numpy_to_torch(value, "to_tf()", count=False)
    return tensor_to_tf(value, copied=copied)
  if not isinstance(value, torch.Tensor):
    return value
  return tensor_to_tf(value)


def tensor_to_tf(x_torch, copied=False):
  """One torch tensor to a TF tensor sharing its buffer (or an aligned copy).

  `copied` says that `x_torch` is already a private copy made on the way
  here, so the exchange is counted as a copy even when TF can view it.
  """
  x_torch = tf_viewable(x_torch, copied)
  if x_torch.is_cuda:
    # TF's DLPack import does no synchronization: make sure the kernels that
    # wrote this buffer on torch's stream are done before TF reads it.
    torch.cuda.current_stream(x_torch.device).synchronize()
  return tf.experimental.dlpack.from_dlpack(torch_dlpack.to_dlpack(x_torch))


def tf_viewable(x_torch, copied=False, device=None):
  """`x_torch` as TF can adopt it through DLPack, counted in the stats.

  Detached, with lazy conjugation or negation resolved, dense row-major and
  64-byte aligned, and on `device` when one is given; the tensor itself
  when it already is all that, else one copy.
  """
  if (x_torch.dtype not in _TF_DTYPE_FROM_TORCH or
      x_torch.layout is not torch.strided or
      x_torch.device.type not in ("cpu", "cuda")):
    _check_torch_kind(x_torch)  # raises the error that names the kind
  if x_torch.requires_grad:
    x_torch = x_torch.detach()
  if x_torch.is_conj() or x_torch.is_neg():
    # A lazily conjugated or negated view: its memory holds other values.
    x_torch = x_torch.resolve_conj().resolve_neg()
    copied = True
  if device is not None and x_torch.device != device:
    x_torch = x_torch.to(device)
    copied = True
  if not _tf_can_view(x_torch):
    x_torch = x_torch.clone(memory_format=torch.contiguous_format)
    copied = True
  _count(x_torch.numel() * x_torch.element_size() if copied else None)
  return x_torch


def _tf_can_view(x_torch):
  # DLPack passes strides as they are, and TF accepts only the dense
  # row-major layout; size-1 dimensions may carry any stride, as in torch's
  # own definition of contiguous.
  if not x_torch.is_contiguous():
    return False
  return x_torch.numel() == 0 or x_torch.data_ptr() % TF_ALIGNMENT == 0


def _check_torch_kind(x_torch):
  problem = None
  if x_torch.layout != torch.strided:
    problem = (f"a sparse torch tensor (layout {x_torch.layout})",
               "convert it to a dense tensor first (`x.to_dense()`)")
  elif x_torch.is_quantized:
    problem = (f"a quantized torch tensor (dtype {x_torch.dtype})",
               "dequantize it first (`x.dequantize()`), or pass "
               "`x.int_repr()` with its scale and zero point")
  elif x_torch.is_meta:
    problem = ("a meta torch tensor (no data, only shape and dtype)",
               "materialize it on a real device first, e.g. "
               "`torch.empty_like(x, device='cpu')`")
  elif x_torch.dtype not in _TF_DTYPE_FROM_TORCH:
    problem = (f"a torch tensor of dtype {x_torch.dtype}, which TF lacks",
               "cast it to a dtype TF has first, e.g. `x.to(torch.float32)`; "
               f"supported: {_dtype_names(_TF_DTYPE_FROM_TORCH)}")
  elif x_torch.device.type not in ("cpu", "cuda"):
    problem = (f"a torch tensor on device {x_torch.device}",
               "move it to the CPU or a CUDA device first (`x.cpu()`)")
  if problem:
    what, fix = problem
    raise TypeError(
        f"to_tf() received {what}, shape {tuple(x_torch.shape)}; TF can "
        f"only hold dense CPU or CUDA tensors. To pass it, {fix}.")


def _dtype_names(dtype_map):
  return ", ".join(str(d).replace("torch.", "").replace("<dtype: ", "")
                   .strip(">'") for d in dtype_map)
