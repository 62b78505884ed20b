"""Zero-copy tensor exchange between TensorFlow and PyTorch through DLPack."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import torch.utils.dlpack as torch_dlpack
import tensorflow as tf

from torchbridge._crossing import _adopt
from torchbridge._runtime import _placement
from torchbridge._crossing import _stats

_UNSUPPORTED_TF_KINDS = (
  (
    tf.RaggedTensor,
    "tf.RaggedTensor",
    "convert it to a dense tensor first (`x.to_tensor()`), or pass "
    "`x.flat_values` and `x.row_splits` as separate tensors",
  ),
  (
    tf.SparseTensor,
    "tf.SparseTensor",
    "convert it to a dense tensor first (`tf.sparse.to_dense(x)`), or pass "
    "`x.indices`, `x.values` and `x.dense_shape` as separate tensors",
  ),
  (
    tf.IndexedSlices,
    "tf.IndexedSlices",
    "convert it to a dense tensor first (`tf.convert_to_tensor(x)`)",
  ),
)


def to_torch(structure: Any) -> Any:
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

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> out = tb.to_torch({"obs": tf.ones([2, 3]), "step": 7})
    >>> out["obs"].shape, out["step"]
    (torch.Size([2, 3]), 7)
  """
  return tf.nest.map_structure(_leaf_to_torch, structure)


def to_tf(structure: Any) -> Any:
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

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> tb.to_tf((torch.zeros(2), torch.ones(3, dtype=torch.int64)))[1].dtype
    tf.int64
  """
  return tf.nest.map_structure(_leaf_to_tf, structure)


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
        f"To pass it, {fix}."
      )


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
      "in `tb.torch_function` or call a `tb.TorchModule`."
    )
  x_torch_dtype = _adopt.torch_dtype_or_none(x_tf.dtype)
  if x_torch_dtype is None:
    # Checked before exporting: TF's DLPack export of a tf.string tensor
    # aborts the process (`Check failed: DataTypeCanUseMemcpy`).
    raise TypeError(
      f"to_torch() received a tensor of dtype {x_tf.dtype.name} "
      f"(shape {x_tf.shape}); torch has no such dtype. Supported dtypes: "
      f"{_adopt.tf_dtype_names()}. Convert it first, e.g. "
      "`tf.strings.to_number(x)` for strings or `tf.cast(x, tf.float32)`."
    )
  # The capsule functions, not `torch.from_dlpack(x_tf)`: the protocol path
  # passes a `stream` for CUDA producers, which EagerTensor.__dlpack__
  # rejects; TF's capsule export synchronizes its device before returning.
  x_torch = torch_dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(x_tf))
  _stats.count()
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
    x_torch = torch.from_numpy(x_np if shareable else np.array(x_np, copy=True, order="C"))
  except TypeError as err:
    raise TypeError(
      f"{func_name} received a numpy array of dtype {x_np.dtype} "
      f"(shape {x_np.shape}), which torch cannot hold. Convert it to a "
      "numeric dtype first, e.g. `x.astype(np.float32)`."
    ) from err
  if count:
    _stats.count(None if shareable else x_torch.numel() * x_torch.element_size())
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
  x_torch = _adopt.tf_viewable(x_torch, copied)
  _placement.ready_for_tf(x_torch)  # TF's DLPack import does not wait
  return tf.experimental.dlpack.from_dlpack(torch_dlpack.to_dlpack(x_torch))
