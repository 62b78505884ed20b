"""Translations of ATen's shape and creation ops, and of the
Python arithmetic on sizes that `torch.export` records for dynamic shapes
(see `_table` for the form)."""

import operator

import tensorflow as tf

from torchbridge._translate import _refusal
from torchbridge._translate._aten import _table
from torchbridge._translate._aten._table import translates, dim_size, shape_arg

_BIG = 2**31 - 1  # torch's "to the end" slice bound is INT64_MAX


@translates("aten.sym_size.int")
def _sym_size(out, x, axis):
  return dim_size(x, axis)


@translates("aten.sym_numel.default", "aten.numel.default")
def _numel(out, x):
  return tf.size(x)


@translates("operator.getitem", channels_last=True)
def _getitem(out, sequence, index):
  value = sequence[index]
  if value is None:
    raise _refusal.Refusal(
      "op", "an op result TF does not compute (such as max_pool2d's indices) is used"
    )
  return value


for _name in (
  "add",
  "sub",
  "mul",
  "floordiv",
  "truediv",
  "mod",
  "neg",
  "eq",
  "ne",
  "lt",
  "le",
  "gt",
  "ge",
  "pow",
):
  translates(f"operator.{_name}")(
    # The default binds this iteration's operator (a closure would see the last).
    lambda out, *args, _fn=getattr(operator, _name): _fn(*args)  # noqa: B008
  )


@translates("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(out, x, sizes):
  return tf.reshape(x, shape_arg(sizes))


@translates("aten.permute.default")
def _permute(out, x, dims):
  return tf.transpose(x, [d % x.shape.rank for d in dims])


@translates("aten.transpose.int")
def _transpose(out, x, dim0, dim1):
  perm = list(range(x.shape.rank))
  perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
  return tf.transpose(x, perm)


@translates("aten.t.default")
def _t(out, x):
  return tf.transpose(x) if x.shape.rank == 2 else x


@translates("aten.expand.default")
def _expand(out, x, sizes, implicit=False):
  lead = len(sizes) - x.shape.rank
  shape = [
    dim_size(x, i - lead) if isinstance(s, int) and s == -1 else s for i, s in enumerate(sizes)
  ]
  return tf.broadcast_to(x, shape_arg(shape))


@translates("aten.unsqueeze.default")
def _unsqueeze(out, x, dim):
  return tf.expand_dims(x, dim % (x.shape.rank + 1))


@translates("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(out, x, dims=None):
  if dims is None:
    dims = range(x.shape.rank)
  dims = [dims] if isinstance(dims, int) else dims
  # torch skips dims that are not of size 1; the recorded shape tells which.
  keep = [d % x.shape.rank for d in dims if x.shape[d] == 1]
  return tf.squeeze(x, keep) if keep else x


def _bound(value):
  if value is None or (isinstance(value, int) and abs(value) >= _BIG):
    return None
  return value


@translates("aten.slice.Tensor")
def _slice(out, x, dim=0, start=None, end=None, step=1):
  start, end = _bound(start), _bound(end)
  if start is None and end is None and step == 1:
    return x
  dim %= x.shape.rank
  return x[(slice(None),) * dim + (slice(start, end, step),)]


@translates("aten.select.int")
def _select(out, x, dim, index):
  dim %= x.shape.rank
  return x[(slice(None),) * dim + (index,)]


@translates("aten.cat.default", "aten.concat.default")
def _cat(out, tensors, dim=0):
  dtype = _table.out_dtype(out)
  tensors = [tf.cast(t, dtype) for t in tensors if t.shape.rank != 1 or t.shape[0] != 0]
  return tf.concat(tensors, dim % tensors[0].shape.rank)


@translates("aten.stack.default")
def _stack(out, tensors, dim=0):
  return tf.stack(tensors, dim % (tensors[0].shape.rank + 1))


@translates("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split.sizes")
def _split(out, x, sizes, dim=0):
  dim %= x.shape.rank
  if isinstance(sizes, int):
    return [x[(slice(None),) * dim + (slice(i, i + sizes),)] for i in range(0, x.shape[dim], sizes)]
  return tf.split(x, list(sizes), dim)


@translates("aten.unbind.int")
def _unbind(out, x, dim=0):
  return tf.unstack(x, axis=dim)


@translates("aten.flip.default")
def _flip(out, x, dims):
  return tf.reverse(x, list(dims))


@translates("aten.repeat.default")
def _repeat(out, x, repeats):
  lead = len(repeats) - x.shape.rank
  x = tf.reshape(x, shape_arg([1] * lead + [dim_size(x, i) for i in range(x.shape.rank)]))
  return tf.tile(x, shape_arg(repeats))


@translates(
  "aten._assert_tensor_metadata.default",
  "aten._assert_scalar.default",
  "aten.sym_constrain_range_for_size.default",
)
def _no_op(out, *unused, **unused_kw):
  return None


@translates(
  "aten.constant_pad_nd.default",
  refuse=lambda node: (
    "negative padding" if any(isinstance(p, int) and p < 0 for p in node.args[1]) else None
  ),
)
def _constant_pad(out, x, pad, value=0):
  pairs = [[0, 0]] * x.shape.rank
  for k in range(len(pad) // 2):
    pairs[x.shape.rank - 1 - k] = [pad[2 * k], pad[2 * k + 1]]
  return tf.pad(x, pairs, constant_values=_table.as_tensor(value, x.dtype))


def _triangle(lower):
  def translate_triangle(out, x, diagonal=0):
    rows = tf.range(dim_size(x, -2))[:, None]
    cols = tf.range(dim_size(x, -1))[None, :]
    keep = (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
    return tf.where(keep, x, tf.zeros_like(x))

  return translate_triangle


translates("aten.tril.default")(_triangle(lower=True))
translates("aten.triu.default")(_triangle(lower=False))


@translates("aten.copy.default")
def _copy(out, destination, source, non_blocking=False):
  del non_blocking
  return tf.broadcast_to(tf.cast(source, destination.dtype), tf.shape(destination))


@translates(
  "aten.slice_scatter.default",
  refuse=lambda node: (
    "slice_scatter with a step"
    if (node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)) != 1
    else None
  ),
)
def _slice_scatter(out, x, source, dim=0, start=None, end=None, step=1):
  del step  # refused above
  dim %= x.shape.rank
  start, end = _bound(start), _bound(end)
  before = x[(slice(None),) * dim + (slice(None, start),)] if start else None
  after = x[(slice(None),) * dim + (slice(end, None),)] if end is not None else None
  parts = [p for p in (before, tf.cast(source, x.dtype), after) if p is not None]
  return tf.concat(parts, dim)


@translates("aten.isnan.default")
def _isnan(out, x):
  return tf.math.is_nan(x) if x.dtype.is_floating else tf.zeros_like(x, tf.bool)


@translates("aten.full.default", "aten.new_full.default")
def _full(out, *args, **unused):
  sizes, value = args[-2], args[-1]
  dtype = _table.out_dtype(out)
  return tf.fill(shape_arg(sizes), _table.as_tensor(value, dtype))


def _filled(value):
  def translate_filled(out, *args, **unused):
    return tf.fill(shape_arg(args[-1]), tf.constant(value, _table.out_dtype(out)))

  return translate_filled


translates(
  "aten.zeros.default",
  "aten.new_zeros.default",
  "aten.empty.memory_format",
  "aten.new_empty.default",
)(_filled(0))


@translates("aten.empty_permuted.default")
def _empty_permuted(out, sizes, physical_layout, **unused):
  del physical_layout  # a memory layout: TF has one
  return tf.zeros(shape_arg(sizes), _table.out_dtype(out))


translates("aten.ones.default", "aten.new_ones.default")(_filled(1))


@translates("aten.full_like.default")
def _full_like(out, x, value, **unused):
  return tf.fill(tf.shape(x), _table.as_tensor(value, _table.out_dtype(out)))


@translates("aten.zeros_like.default", "aten.empty_like.default")
def _zeros_like(out, x, **unused):
  return tf.zeros_like(x, _table.out_dtype(out))


@translates("aten.ones_like.default")
def _ones_like(out, x, **unused):
  return tf.ones_like(x, _table.out_dtype(out))


@translates("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(out, *args, **unused):
  bounds = [a for a in args if not isinstance(a, (tuple, list))]
  start, end, step = ([0] + bounds + [1])[:3] if len(bounds) == 1 else (bounds + [1])[:3]
  dtype = _table.out_dtype(out)
  return tf.range(
    _table.as_tensor(start, dtype), _table.as_tensor(end, dtype), _table.as_tensor(step, dtype)
  )


@translates("aten.scalar_tensor.default")
def _scalar_tensor(out, value, **unused):
  return _table.as_tensor(value, _table.out_dtype(out))
