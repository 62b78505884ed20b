"""Translations of ATen's convolutions and pooling, channels-last (TF's CPU
kernels run NHWC only; see `_channels_last` and `_table`)."""

import math

import tensorflow as tf

from torchbridge._translate import _refusal
from torchbridge._translate._aten import _table
from torchbridge._translate import _channels_last
from torchbridge._translate._aten._table import translates
from torchbridge._translate._channels_last import ChannelsLast
from torchbridge._translate._channels_last import to_channels_last


def _refuse_convolution(node):
  dilation, transposed, groups = node.args[5], node.args[6], node.args[8]
  if transposed and (groups != 1 or any(d != 1 for d in dilation)):
    return "transposed convolution with groups or dilation"
  return None


@translates("aten.convolution.default", channels_last=True, refuse=_refuse_convolution)
def _convolution(
  out, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
  if transposed:
    return _transposed_convolution(x, weight, bias, stride, padding, output_padding)
  x_tf = to_channels_last(x)
  spatial = len(stride)
  if any(padding):
    x_tf = tf.pad(x_tf, [[0, 0]] + [[p, p] for p in padding] + [[0, 0]])
  # torch (O, I/groups, *K) -> TF (*K, I/groups, O)
  w_tf = tf.transpose(weight, [*range(2, 2 + spatial), 1, 0])
  # tf.nn.convolution refuses strides and dilations both > 1: convolve at
  # stride 1 and subsample, which is the same under VALID padding.
  both = any(s > 1 for s in stride) and any(d > 1 for d in dilation)
  strides = [1] * spatial if both else list(stride)

  def conv(x_part, w_part):
    return tf.nn.convolution(
      x_part, w_part, strides=strides, padding="VALID", dilations=list(dilation)
    )

  if groups == 1:
    y_tf = conv(x_tf, w_tf)
  else:  # split and concatenate: correct on every TF backend and in TFLite
    y_tf = tf.concat(
      [
        conv(xg, wg)
        for xg, wg in zip(tf.split(x_tf, groups, axis=-1), tf.split(w_tf, groups, axis=-1))
      ],
      axis=-1,
    )
  if both:
    y_tf = y_tf[(slice(None),) + tuple(slice(None, None, s) for s in stride)]
  if bias is not None:
    y_tf = y_tf + bias
  return ChannelsLast(y_tf)


def _transposed_convolution(x, weight, bias, stride, padding, output_padding):
  """torch's ConvTranspose (groups 1, no dilation): TF's full (VALID)
  transposed convolution, cropped by `padding`, `output_padding` kept."""
  x_tf = to_channels_last(x)
  spatial = len(stride)
  kernel = weight.shape[2:]
  # torch (I, O, *K) -> TF (*K, O, I)
  w_tf = tf.transpose(weight, [*range(2, 2 + spatial), 1, 0])
  full = [(_table.dim_size(x_tf, 1 + k) - 1) * stride[k] + kernel[k] for k in range(spatial)]
  shape = _table.shape_arg([_table.dim_size(x_tf, 0), *full, weight.shape[1]])
  y_tf = tf.nn.conv_transpose(x_tf, w_tf, shape, list(stride), "VALID")
  if any(p < o for p, o in zip(padding, output_padding)):
    y_tf = tf.pad(
      y_tf, [[0, 0]] + [[0, max(0, o - p)] for p, o in zip(padding, output_padding)] + [[0, 0]]
    )
  # torch's size: full - 2 * padding + output_padding, from `padding` on.
  y_tf = y_tf[
    (slice(None),)
    + tuple(slice(p, -(p - o) if p > o else None) for p, o in zip(padding, output_padding))
  ]
  return ChannelsLast(y_tf if bias is None else y_tf + bias)


def _pool_padding(size, kernel, stride, pad, ceil_mode):
  """(left, right) padding of one spatial axis, ceil_mode's extra included."""
  if not ceil_mode:
    return pad, pad
  if not isinstance(size, int):
    raise _refusal.Refusal("op", "ceil_mode pooling over a dynamic dimension")
  count = math.ceil((size + 2 * pad - kernel) / stride) + 1
  if (count - 1) * stride >= size + pad:
    count -= 1
  return pad, max(pad, (count - 1) * stride + kernel - size - pad)


def _per_axis(values, spatial):
  values = list(values)
  return values * spatial if len(values) == 1 else values


def _pooling(pool):
  """`pool(x_tf, kernel, stride, padding, *rest)` on channels-last
  (N, *spatial, C), for torch's batched and unbatched (C, *spatial) inputs."""

  def translate_pool(out, x, kernel, stride=(), padding=(0,), *rest):
    spatial = len(kernel)
    stride = _per_axis(stride or kernel, spatial)
    padding = _per_axis(padding, spatial)
    unbatched = not isinstance(x, ChannelsLast) and x.shape.rank == spatial + 1
    x_tf = to_channels_last(tf.expand_dims(x, 0) if unbatched else x)
    result = pool(x_tf, list(kernel), stride, padding, *rest)
    y_tf = result[0] if isinstance(result, tuple) else result
    if unbatched:
      y = _channels_last.to_torch_layout(ChannelsLast(y_tf))[0]
    else:
      y = ChannelsLast(y_tf)
    return (y, None) if isinstance(out, (tuple, list)) else y

  return translate_pool


def _pads(x_tf, kernel, stride, padding, ceil_mode):
  return (
    [[0, 0]]
    + [
      list(_pool_padding(x_tf.shape[1 + k], kernel[k], stride[k], padding[k], ceil_mode))
      for k in range(len(kernel))
    ]
    + [[0, 0]]
  )


def _refuse_dilated_pool(node):
  dilation = node.args[4] if len(node.args) > 4 else [1]
  return "dilated max pooling" if any(d != 1 for d in dilation) else None


@translates(
  "aten.max_pool2d_with_indices.default",
  "aten.max_pool1d_with_indices.default",
  "aten.max_pool3d_with_indices.default",
  "aten.max_pool2d.default",
  channels_last=True,
  refuse=_refuse_dilated_pool,
)
@_pooling
def _max_pool(x_tf, kernel, stride, padding, dilation=(1,), ceil_mode=False):
  del dilation  # refused above
  pads = _pads(x_tf, kernel, stride, padding, ceil_mode)
  if any(p != 0 for pair in pads for p in pair):
    x_tf = tf.pad(x_tf, pads, constant_values=x_tf.dtype.min)
  return tf.nn.max_pool(x_tf, kernel, stride, "VALID")


@translates(
  "aten.avg_pool2d.default",
  "aten.avg_pool1d.default",
  "aten.avg_pool3d.default",
  channels_last=True,
)
@_pooling
def _avg_pool(
  x_tf, kernel, stride, padding, ceil_mode=False, count_include_pad=True, divisor_override=None
):
  pads = _pads(x_tf, kernel, stride, padding, ceil_mode)
  padded = any(p != 0 for pair in pads for p in pair)
  y_tf = tf.nn.avg_pool(tf.pad(x_tf, pads) if padded else x_tf, kernel, stride, "VALID")
  if divisor_override:
    return y_tf * (math.prod(kernel) / divisor_override)
  extra = any(pair[1] != pair[0] for pair in pads)
  if padded and (not count_include_pad or extra):
    # torch divides by the count of real (or, with count_include_pad, of
    # real and symmetric-padding) positions; ceil_mode's extra never counts.
    ones = tf.ones_like(x_tf[..., :1])
    if count_include_pad:
      ones = tf.pad(
        ones, [[0, 0]] + [[p[0], p[0]] for p in pads[1:-1]] + [[0, 0]], constant_values=1.0
      )
      pads = [[0, 0]] + [[0, p[1] - p[0]] for p in pads[1:-1]] + [[0, 0]]
    y_tf = y_tf / tf.nn.avg_pool(tf.pad(ones, pads), kernel, stride, "VALID")
  return y_tf


def _adaptive(reduce_fn):
  """torch's adaptive pooling: output cell i of an axis of size L pools
  [floor(i * L / n), ceil((i + 1) * L / n)); static sizes only."""

  def translate_adaptive(out, x, output_size):
    spatial = len(output_size)
    unbatched = not isinstance(x, ChannelsLast) and x.shape.rank == spatial + 1
    y_tf = to_channels_last(tf.expand_dims(x, 0) if unbatched else x)
    for k, n in enumerate(output_size):
      axis, size = 1 + k, y_tf.shape[1 + k]
      if size is None:
        raise _refusal.Refusal("op", "adaptive pooling over a dynamic dimension")
      if n == size:
        continue
      cells = [
        y_tf[(slice(None),) * axis + (slice(i * size // n, -(-(i + 1) * size // n)),)]
        for i in range(n)
      ]
      y_tf = tf.concat([reduce_fn(c, axis, keepdims=True) for c in cells], axis)
    if unbatched:
      y = _channels_last.to_torch_layout(ChannelsLast(y_tf))[0]
    else:
      y = ChannelsLast(y_tf)
    return (y, None) if isinstance(out, (tuple, list)) else y

  return translate_adaptive


translates(
  "aten._adaptive_avg_pool2d.default",
  "aten.adaptive_avg_pool2d.default",
  "aten._adaptive_avg_pool3d.default",
  channels_last=True,
)(_adaptive(tf.reduce_mean))
translates(
  "aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default", channels_last=True
)(_adaptive(tf.reduce_max))
