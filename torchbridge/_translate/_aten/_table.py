"""The table of ATen ops that translate to TF, and what its entries share.

Each entry maps one ATen overload (as `str(op)` names it,
`"aten.relu.default"`) or one Python operator on sizes (`"operator.mul"`)
to a function `fn(out, *args, **kwargs)` that builds TF ops. `out` is the
value torch's exporter recorded for the node (a fake tensor: its dtype and
shape, or a tuple of them); `args` hold TF tensors, Python numbers and
lists. Entries marked `channels_last=True` also accept
`_channels_last.ChannelsLast` values; the others get torch's layout.

An entry may give `refuse(node) -> str | None`: the reason a node of that op
cannot be translated (say a transposed convolution), found before anything
runs, so that one error can list every such node of a model.
"""

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf
from typing import Any

from torchbridge._translate import _refusal

OPS: dict[str, tuple[Any, Any, Any]] = {}
# Ops that draw random numbers: their translation takes `draw=`, the value
# torch drew, when a check at capture compares the two value for value.
RANDOM: set[str] = set()

_TORCH_TO_TF_DTYPES = {
  torch.float16: tf.float16,
  torch.bfloat16: tf.bfloat16,
  torch.float32: tf.float32,
  torch.float64: tf.float64,
  torch.int8: tf.int8,
  torch.int16: tf.int16,
  torch.int32: tf.int32,
  torch.int64: tf.int64,
  torch.uint8: tf.uint8,
  torch.bool: tf.bool,
  torch.complex64: tf.complex64,
  torch.complex128: tf.complex128,
}


def translates(*names, channels_last=False, refuse=None, random=False):
  """Registers the decorated function as the translation of `names`
  (`random=True`: it draws random numbers and accepts `draw=`)."""

  def register(fn):
    for name in names:
      OPS[name] = (fn, channels_last, refuse)
      if random:
        RANDOM.add(name)
    return fn

  return register


def op_key(target):
  """The table key of an FX node target (an ATen overload or a Python
  operator on sizes)."""
  module = getattr(target, "__module__", None)
  if module in ("_operator", "operator"):
    return f"operator.{target.__name__}"
  if module in ("math", "builtins"):
    return f"{module}.{target.__name__}"
  return str(target)


def tf_dtype(dtype_torch):
  """The TF dtype of a torch dtype; a `Refusal` for dtypes TF lacks."""
  try:
    return _TORCH_TO_TF_DTYPES[dtype_torch]
  except KeyError:
    raise _refusal.Refusal("op", f"dtype {dtype_torch} has no TensorFlow equivalent") from None


def out_dtype(out):
  """The TF dtype of a node's recorded (single tensor) result."""
  return tf_dtype(out.dtype)


def dim_size(x_tf, axis):
  """Size of `axis` of `x_tf`: a Python int when static, else a scalar."""
  size = x_tf.shape[axis]
  return size if size is not None else tf.shape(x_tf)[axis]


def shape_arg(sizes):
  """A torch size list (ints and scalar tensors) as a TF shape argument."""
  sizes = list(sizes)
  if all(isinstance(s, int) for s in sizes):
    return sizes
  return tf.stack([tf.cast(s, tf.int32) for s in sizes])


def as_tensor(value, dtype):
  """`value` (a TF tensor or a Python number) as a tensor of `dtype`."""
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return value if value.dtype == dtype else tf.cast(value, dtype)
  return tf.constant(value, dtype)


def is_floating(dtype):
  return dtype.is_floating or dtype.is_complex


def promoted(a, b):
  """The dtype torch computes `a (op) b` in (tensors and Python numbers),
  without torch's special rule for 0-d tensors."""
  kinds = []
  for v in (a, b):
    if isinstance(v, (tf.Tensor, tf.Variable)):
      kinds.append(v.dtype)
  if not kinds:
    return tf.float32 if any(isinstance(v, float) for v in (a, b)) else tf.int64
  if len(kinds) == 2 and kinds[0] != kinds[1]:
    return max(kinds, key=_rank_of_dtype)
  dtype = kinds[0]
  scalar = b if isinstance(a, (tf.Tensor, tf.Variable)) else a
  if isinstance(scalar, float) and not is_floating(dtype):
    return tf.float32
  if isinstance(scalar, int) and not isinstance(scalar, bool) and dtype == tf.bool:
    return tf.int64
  return dtype


def _rank_of_dtype(dtype):
  if dtype == tf.bool:
    return 0
  if dtype.is_integer:
    return 1 + dtype.size
  return 10 + dtype.size
