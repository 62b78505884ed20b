"""Zero-copy tensor exchange between TensorFlow and PyTorch through DLPack."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
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
  return tf.nest.map_structure(
    functools.partial(_located, _leaf_to_torch, "to_torch()", structure), structure
  )


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
  return tf.nest.map_structure(
    functools.partial(_located, _leaf_to_tf, "to_tf()", structure), structure
  )


def _located(convert: Callable[[Any], Any], func_name: str, structure: Any, value: Any) -> Any:
  """`convert(value)`; a refusal says where in `structure` the value is."""
  try:
    return convert(value)
  except TypeError as err:
    where = nest_path(structure, value, "structure")
    raise TypeError(received_at(str(err), func_name, where)) from err


def nest_path(structure: Any, leaf: Any, root: str) -> str | None:
  """Where `leaf` (this very object) sits in `structure`, written as Python
  indexes it (`structure['obs'][1]`); None at the root or if absent."""
  stack = [(structure, root)]
  while stack:
    node, path = stack.pop()
    if node is leaf:
      return None if path == root else path
    if isinstance(node, Mapping):
      items = [(f"[{key!r}]", value) for key, value in node.items()]
    elif isinstance(node, tuple) and hasattr(node, "_fields"):
      items = [(f".{field}", getattr(node, field)) for field in node._fields]
    elif isinstance(node, (list, tuple)):
      items = [(f"[{k}]", value) for k, value in enumerate(node)]
    else:
      continue
    stack.extend((value, path + key) for key, value in reversed(items))
  return None


def received_at(message: str, func_name: str, where: str | None) -> str:
  """`message` ("f() received a ...") saying where: "f() received, at
  args[0]['obs'][1], a ..."."""
  if where is None:
    return message
  return message.replace(f"{func_name} received", f"{func_name} received, at {where},", 1)


def is_tf_tensor(value: object) -> bool:
  """True for values that `to_torch` turns into torch tensors."""
  return isinstance(value, (tf.Tensor, tf.Variable, np.ndarray))


def check_tf_leaf(value: object, func_name: str) -> None:
  """Raises a `TypeError` for TF tensor kinds that cannot cross."""
  for kind, kind_name, fix in _UNSUPPORTED_TF_KINDS:
    if isinstance(value, kind):
      raise TypeError(
        f"{func_name} received a {kind_name} (dtype {value.dtype}, shape "
        f"{value.shape}); torchbridge exchanges dense tensors only. "
        f"To pass it, {fix}."
      )


def _leaf_to_torch(value: Any) -> Any:
  check_tf_leaf(value, "to_torch()")
  if isinstance(value, np.ndarray):
    return _numpy_to_torch(value, "to_torch()")[0]
  if isinstance(value, tf.Variable):
    value = value.value()
  if not isinstance(value, tf.Tensor):
    return value
  return tensor_to_torch(value)


def tensor_to_torch(x_tf: tf.Tensor, counted: bool = True) -> torch.Tensor:
  """One dense eager TF tensor to a torch view of its buffer (counted as a
  zero-copy crossing unless `counted` is False: the caller counts it)."""
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
  if counted:
    _stats.count()
  return x_torch


_NUMPY_BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)


def _numpy_to_torch(
  x_np: np.ndarray, func_name: str, count: bool = True
) -> tuple[torch.Tensor, bool]:
  """A numpy array to torch, sharing memory where torch can.

  Returns the torch tensor and whether it is a copy.
  """
  has_negative_stride = any(s < 0 for s in x_np.strides)
  # torch cannot view negative strides, and a read-only buffer must not
  # become a writable torch tensor: those are copied.
  shareable = x_np.flags.writeable and not has_negative_stride
  source = x_np if shareable else np.array(x_np, copy=True, order="C")
  try:
    if x_np.dtype == _NUMPY_BFLOAT16:
      # What `x_tf.numpy()` gives for bfloat16 (ml_dtypes), which
      # torch.from_numpy does not know: the same bits, viewed.
      x_torch = torch.from_numpy(source.view(np.uint16)).view(torch.bfloat16)
    else:
      x_torch = torch.from_numpy(source)
  except TypeError as err:
    raise TypeError(
      f"{func_name} received a numpy array of dtype {x_np.dtype} "
      f"(shape {x_np.shape}), which torch cannot hold. Convert it to a "
      "numeric dtype first, e.g. `x.astype(np.float32)`."
    ) from err
  if count:
    _stats.count(None if shareable else x_torch.numel() * x_torch.element_size())
  return x_torch, not shareable


def _leaf_to_tf(value: Any) -> Any:
  if isinstance(value, np.ndarray):
    value, copied = _numpy_to_torch(value, "to_tf()", count=False)
    return tensor_to_tf(value, copied=copied)
  if not isinstance(value, torch.Tensor):
    return value
  return tensor_to_tf(value)


def tensor_to_tf(x_torch: torch.Tensor, copied: bool = False) -> tf.Tensor:
  """One torch tensor to a TF tensor sharing its buffer (or an aligned copy).

  `copied` says that `x_torch` is already a private copy made on the way
  here, so the exchange is counted as a copy even when TF can view it.
  """
  x_torch = _adopt.tf_viewable(x_torch, copied)
  _placement.ready_for_tf(x_torch)  # TF's DLPack import does not wait
  return tf.experimental.dlpack.from_dlpack(torch_dlpack.to_dlpack(x_torch))


def handle_to_tf(handle_torch: torch.Tensor) -> tf.Tensor:
  """A bridged call's one-byte handle (`_call._graph`) as a TF tensor on the
  `tf.py_function` path: the bridge's own bookkeeping, not a tensor of the
  user's, so not counted in `exchange_stats()` (the native op does not
  count it either)."""
  return tf.experimental.dlpack.from_dlpack(torch_dlpack.to_dlpack(handle_torch))


def tf_owned_copy(tensor_torch: torch.Tensor) -> tf.Tensor:
  """A TF tensor holding a copy of a torch tensor, in a TF-allocated buffer.

  A variable whose buffer came from DLPack or numpy cannot be updated in
  place: TF copies it on the first optimizer step. Starting from a buffer TF
  allocated keeps every update in place. Placed on the torch tensor's device.
  """
  if tensor_torch.is_cuda:
    device = f"/GPU:{tensor_torch.device.index}"
  else:
    device = "/CPU:0"
  with tf.device(device):
    return tf_owned(tensor_to_tf(tensor_torch.detach()))


def tf_owned(value_tf: tf.Tensor) -> tf.Tensor:
  """`value_tf` copied into a buffer TF allocated (see `tf_owned_copy`)."""
  try:
    return tf.raw_ops.DeepCopy(x=value_tf)
  except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError):
    return value_tf  # no kernel for this dtype and device: TF copies once
