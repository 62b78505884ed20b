"""Translations of ATen's tensor ops: elementwise math, comparisons,
reductions (see `_table` for the form)."""

import tensorflow as tf

from torchbridge._translate._aten import _table
from torchbridge._translate import _channels_last
from torchbridge._translate._aten._table import translates, dim_size
from torchbridge._translate._channels_last import ChannelsLast, tf_axis

_T = (tf.Tensor, tf.Variable)


def _unary(fn):
  def translate_unary(out, x, *args, **kwargs):
    if isinstance(x, ChannelsLast):
      return ChannelsLast(fn(out, x.tensor_tf, *args, **kwargs))
    return fn(out, x, *args, **kwargs)

  return translate_unary


def _unaries(table):
  for names, fn in table.items():
    translates(*names.split(), channels_last=True)(_unary(fn))


_unaries(
  {
    "aten.relu.default": lambda out, x: tf.nn.relu(x),
    "aten.tanh.default": lambda out, x: tf.tanh(x),
    "aten.sigmoid.default": lambda out, x: tf.sigmoid(x),
    "aten.exp.default": lambda out, x: tf.exp(x),
    "aten.log.default": lambda out, x: tf.math.log(x),
    "aten.sqrt.default": lambda out, x: tf.sqrt(x),
    "aten.rsqrt.default": lambda out, x: tf.math.rsqrt(x),
    "aten.abs.default": lambda out, x: tf.abs(x),
    "aten.neg.default": lambda out, x: -x,
    "aten.sin.default": lambda out, x: tf.sin(x),
    "aten.cos.default": lambda out, x: tf.cos(x),
    "aten.erf.default": lambda out, x: tf.math.erf(x),
    "aten.log1p.default": lambda out, x: tf.math.log1p(x),
    "aten.expm1.default": lambda out, x: tf.math.expm1(x),
    "aten.reciprocal.default": lambda out, x: tf.math.reciprocal(x),
    "aten.sign.default": lambda out, x: tf.sign(x),
    "aten.floor.default": lambda out, x: tf.floor(x),
    "aten.ceil.default": lambda out, x: tf.math.ceil(x),
    "aten.logical_not.default aten.bitwise_not.default": lambda out, x: tf.logical_not(
      tf.cast(x, tf.bool)
    ),
    "aten.silu.default": lambda out, x: x * tf.sigmoid(x),
    "aten.softplus.default": lambda out, x, beta=1, threshold=20: tf.where(
      x * beta > threshold, x, tf.math.softplus(x * beta) / beta
    ),
    "aten.elu.default": lambda out, x, alpha=1.0, scale=1.0, input_scale=1.0: (
      scale * tf.where(x > 0, x, alpha * tf.math.expm1(x * input_scale))
    ),
    "aten.leaky_relu.default": lambda out, x, slope=0.01: tf.where(x > 0, x, x * slope),
    "aten.hardtanh.default": lambda out, x, lo=-1.0, hi=1.0: tf.clip_by_value(x, lo, hi),
    "aten.hardsigmoid.default": lambda out, x: tf.clip_by_value(x / 6 + 0.5, 0.0, 1.0),
    "aten.hardswish.default": lambda out, x: x * tf.clip_by_value(x / 6 + 0.5, 0.0, 1.0),
    "aten.clone.default aten.alias.default aten.detach.default "
    "aten.lift_fresh_copy.default aten.contiguous.default": lambda out, x, **unused: tf.identity(x),
    "aten._to_copy.default aten.to.dtype": lambda out, x, *unused, **unused_kw: tf.cast(
      x, _table.out_dtype(out)
    ),
    "aten.clamp.default aten.clamp.Tensor": lambda out, x, lo=None, hi=None: _clamp(x, lo, hi),
    "aten.clamp_min.default": lambda out, x, lo: _clamp(x, lo, None),
    "aten.clamp_max.default": lambda out, x, hi: _clamp(x, None, hi),
    "aten.pow.Tensor_Scalar": lambda out, x, p: _pow(out, x, p),
  }
)


def _clamp(x, lo, hi):
  if lo is not None:
    x = tf.maximum(x, _table.as_tensor(lo, x.dtype))
  if hi is not None:
    x = tf.minimum(x, _table.as_tensor(hi, x.dtype))
  return x


def _pow(out, x, p):
  dtype = _table.out_dtype(out)
  x = tf.cast(x, dtype)
  if p == 2:
    return x * x
  if p == 0.5:
    return tf.sqrt(x)
  return tf.pow(x, _table.as_tensor(p, dtype))


def _is_scalar(v):
  return not isinstance(v, (ChannelsLast,) + _T) or v.shape.rank == 0


def _binary(fn, compare=False):
  """`fn(a_tf, b_tf)` after torch's type promotion; keeps channels-last
  when both sides are, or the other side is a scalar."""

  def translate_binary(out, a, b, alpha=1, **unused):
    layout = ChannelsLast
    if isinstance(a, layout) or isinstance(b, layout):
      if (
        (isinstance(a, layout) or _is_scalar(a))
        and (isinstance(b, layout) or _is_scalar(b))
        and not (isinstance(a, layout) and isinstance(b, layout) and a.rank != b.rank)
      ):
        a = a.tensor_tf if isinstance(a, layout) else a
        b = b.tensor_tf if isinstance(b, layout) else b
        return layout(translate_binary(out, a, b, alpha))
      a = _channels_last.to_torch_layout(a)
      b = _channels_last.to_torch_layout(b)
    dtype = _table.promoted(a, b) if compare else _table.out_dtype(out)
    a, b = _table.as_tensor(a, dtype), _table.as_tensor(b, dtype)
    if alpha != 1:
      b = b * _table.as_tensor(alpha, dtype)
    return fn(a, b)

  return translate_binary


def _binaries(table, compare=False):
  for names, fn in table.items():
    translates(*names.split(), channels_last=True)(_binary(fn, compare))


_binaries(
  {
    "aten.add.Tensor aten.add.Scalar": tf.add,
    "aten.sub.Tensor aten.sub.Scalar": tf.subtract,
    "aten.rsub.Scalar aten.rsub.Tensor": lambda a, b: b - a,
    "aten.mul.Tensor aten.mul.Scalar": tf.multiply,
    "aten.div.Tensor aten.div.Scalar": tf.divide,
    "aten.pow.Tensor_Tensor aten.pow.Scalar": tf.pow,
    "aten.maximum.default": tf.maximum,
    "aten.minimum.default": tf.minimum,
    "aten.remainder.Tensor aten.remainder.Scalar": tf.math.floormod,
    "aten.fmod.Tensor aten.fmod.Scalar": tf.truncatemod,
    "aten.atan2.default": tf.atan2,
  }
)
_binaries(
  {
    "aten.eq.Tensor aten.eq.Scalar": tf.equal,
    "aten.ne.Tensor aten.ne.Scalar": tf.not_equal,
    "aten.lt.Tensor aten.lt.Scalar": tf.less,
    "aten.le.Tensor aten.le.Scalar": tf.less_equal,
    "aten.gt.Tensor aten.gt.Scalar": tf.greater,
    "aten.ge.Tensor aten.ge.Scalar": tf.greater_equal,
    "aten.logical_and.default aten.bitwise_and.Tensor": lambda a, b: tf.logical_and(
      tf.cast(a, tf.bool), tf.cast(b, tf.bool)
    ),
    "aten.logical_or.default aten.bitwise_or.Tensor": lambda a, b: tf.logical_or(
      tf.cast(a, tf.bool), tf.cast(b, tf.bool)
    ),
  },
  compare=True,
)


@translates("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(out, a, b, rounding_mode=None):
  dtype = _table.promoted(a, b)
  a, b = _table.as_tensor(a, dtype), _table.as_tensor(b, dtype)
  if rounding_mode == "floor":
    return tf.math.floordiv(a, b)
  if rounding_mode == "trunc":
    return tf.truncatediv(a, b) if dtype.is_integer else (tf.sign(a / b) * tf.floor(tf.abs(a / b)))
  return tf.divide(a, b)


@translates(
  "aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar"
)
def _where(out, condition, a, b):
  dtype = _table.out_dtype(out)
  return tf.where(
    tf.cast(condition, tf.bool), _table.as_tensor(a, dtype), _table.as_tensor(b, dtype)
  )


@translates("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(out, x, mask, value):
  return tf.where(tf.cast(mask, tf.bool), _table.as_tensor(value, x.dtype), x)


# --- reductions -------------------------------------------------------------


def _axes(dims, rank):
  if dims is None or len(dims) == 0:
    return list(range(rank))
  return [d % rank for d in dims]


def _reduction(fn):
  def translate_reduction(out, x, dims=None, keepdim=False, **unused):
    if isinstance(dims, int):
      dims = [dims]
    if isinstance(x, ChannelsLast):
      if not keepdim:
        return translate_reduction(out, _channels_last.to_torch_layout(x), dims, keepdim)
      axes = [tf_axis(a, x.rank) for a in _axes(dims, x.rank)]
      return ChannelsLast(fn(out, x.tensor_tf, axes, True))
    return fn(out, x, _axes(dims, x.shape.rank), keepdim)

  return translate_reduction


def _cast_to_out(fn):
  return lambda out, x, axes, keep: fn(tf.cast(x, _table.out_dtype(out)), axes, keepdims=keep)


for _names, _fn in {
  "aten.sum.dim_IntList aten.sum.default": _cast_to_out(tf.reduce_sum),
  "aten.mean.dim aten.mean.default": _cast_to_out(tf.reduce_mean),
  "aten.prod.default aten.prod.dim_int": _cast_to_out(tf.reduce_prod),
  "aten.amax.default aten.max.default": lambda out, x, axes, keep: tf.reduce_max(
    x, axes, keepdims=keep
  ),
  "aten.amin.default aten.min.default": lambda out, x, axes, keep: tf.reduce_min(
    x, axes, keepdims=keep
  ),
  "aten.any.dim aten.any.default aten.any.dims": lambda out, x, axes, keep: tf.reduce_any(
    tf.cast(x, tf.bool), axes, keepdims=keep
  ),
  "aten.all.dim aten.all.default aten.all.dims": lambda out, x, axes, keep: tf.reduce_all(
    tf.cast(x, tf.bool), axes, keepdims=keep
  ),
}.items():
  translates(*_names.split(), channels_last=True)(_reduction(_fn))


@translates("aten.var.correction", "aten.var.dim")
def _var(out, x, dims=None, unbiased=None, keepdim=False, correction=None):
  axes = _axes(dims, x.shape.rank)
  if correction is None:
    correction = 0 if unbiased is False else 1
  mean = tf.reduce_mean(x, axes, keepdims=True)
  n = tf.cast(tf.reduce_prod([dim_size(x, a) for a in axes]), x.dtype)
  return tf.reduce_sum(tf.square(x - mean), axes, keepdims=keepdim) / (n - correction)


def _arg_reduction(reduce_fn, arg_fn):
  def translate_with_indices(out, x, dim, keepdim=False):
    values = reduce_fn(x, dim, keepdims=keepdim)
    indices = arg_fn(x, dim, output_type=tf.int64)
    if keepdim:
      indices = tf.expand_dims(indices, dim)
    return values, indices

  def translate_arg(out, x, dim=None, keepdim=False):
    if dim is None:
      x, dim = tf.reshape(x, [-1]), 0
    return translate_with_indices(out, x, dim, keepdim)[1]

  return translate_with_indices, translate_arg


for _name, (_reduce, _arg) in {
  "max": (tf.reduce_max, tf.argmax),
  "min": (tf.reduce_min, tf.argmin),
}.items():
  _with_indices, _only_indices = _arg_reduction(_reduce, _arg)
  translates(f"aten.{_name}.dim")(_with_indices)
  translates(f"aten.arg{_name}.default")(_only_indices)


@translates("aten.cumsum.default")
def _cumsum(out, x, dim, dtype=None):
  return tf.cumsum(tf.cast(x, _table.out_dtype(out)), dim)
