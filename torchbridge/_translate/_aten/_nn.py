"""Translations of ATen's neural-network ops that TF has whole: matmuls and
`linear`, attention, softmax, GELU, batch, instance, group and layer norm,
embeddings (see `_table`; convolutions and pooling are in
`_conv`)."""

import math

import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._translate._aten import _table
from torchbridge._translate._aten._table import translates
from torchbridge._translate._channels_last import ChannelsLast


def _matmul_2d(x, w, transpose_w=False):
  """`x @ w` (`x @ w.T` with `transpose_w`) for x of any rank >= 2, as one
  2-D matmul (TFLite's FULLY_CONNECTED, XLA's dot)."""
  if x.shape.rank == 2:
    x_2d = x
  else:
    # The inner size from the weight: x's last dimension may be unknown in
    # the graph (after a reshape with -1) while the weight's never is.
    inner = w.shape[-1 if transpose_w else 0]
    inner = inner if inner is not None else tf.shape(x)[-1]
    x_2d = tf.reshape(x, [-1, inner])
  y = _times_transposed(x_2d, w) if transpose_w else tf.matmul(x_2d, w)
  if x.shape.rank == 2:
    return y
  return tf.reshape(y, tf.concat([tf.shape(x)[:-1], tf.shape(y)[-1:]], 0))


def _times_transposed(x, w):
  """`x @ w.T` for a 2-D `x` and a torch-layout `(out, in)` weight `w`.

  Under XLA it is written `(w @ x.T).T`: on a TD3-critic-shaped step of
  plain TF ops on the CPU it brought torch's layout from 1.055x to 1.020x
  Keras' `(in, out)` kernels (`benchmarks/weight_layout.py`); in the whole
  TD3 step the two forms measured within noise of each other
  (`benchmarks/paired_step.py`). Without XLA the transpose would be an op
  of its own, so it stays `matmul(transpose_b=True)`.
  """
  if _compat.in_xla_context():
    return tf.transpose(tf.matmul(w, x, transpose_b=True))
  return tf.matmul(x, w, transpose_b=True)


@translates("aten.linear.default")
def _linear(out, x, weight, bias=None):
  # The weight itself is never transposed (tf.transpose(weight)): a
  # transposed variable inside a nested function makes XLA recompile a
  # jit-compiled training step on every call (TF 2.21); the matmul reads
  # the weight as it is.
  y = _matmul_2d(x, weight, transpose_w=True)
  if bias is None:
    return y
  if bias.shape.rank == 1 and (y.shape.rank or 0) >= 2 and y.dtype == bias.dtype:
    # BiasAdd, as Keras' Dense: its gradient is one BiasAddGrad, where a
    # broadcasting add's is a reduction and a reshape.
    return tf.nn.bias_add(y, bias)
  return y + bias


@translates("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _mm(out, a, b):
  if b.shape.rank == 2 and a.shape.rank > 2:
    return _matmul_2d(a, b)
  return tf.matmul(a, b)


@translates("aten.addmm.default")
def _addmm(out, bias, a, b, beta=1, alpha=1):
  product = tf.matmul(a, b)
  product = product if alpha == 1 else product * alpha
  return product + (bias if beta == 1 else bias * beta)


@translates("aten.baddbmm.default")
def _baddbmm(out, bias, a, b, beta=1, alpha=1):
  return _addmm(out, bias, a, b, beta, alpha)


def _refuse_attention_dropout(node):
  dropout = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
  return "attention dropout (dropout_p > 0)" if dropout else None


@translates("aten.scaled_dot_product_attention.default", refuse=_refuse_attention_dropout)
def _attention(
  out, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
  del dropout_p  # refused above
  if enable_gqa and k.shape[-3] != q.shape[-3]:
    repeats = q.shape[-3] // k.shape[-3]
    k = tf.repeat(k, repeats, axis=-3)
    v = tf.repeat(v, repeats, axis=-3)
  if scale is None:
    scale = 1.0 / math.sqrt(q.shape[-1])
  logits = tf.matmul(q, k, transpose_b=True) * scale
  allowed = None  # where a query may attend; torch gives a row with none zeros
  if is_causal:
    rows = tf.range(_table.dim_size(q, -2))[:, None]
    cols = tf.range(_table.dim_size(k, -2))[None, :]
    allowed = cols <= rows
  if attn_mask is not None:
    if attn_mask.dtype != tf.bool:  # an additive mask; -inf blocks, as False does
      finite = attn_mask > float("-inf")
      logits = logits + tf.where(finite, attn_mask, tf.zeros_like(attn_mask))
      attn_mask = finite
    allowed = attn_mask if allowed is None else tf.logical_and(allowed, attn_mask)
  if allowed is None:
    return tf.matmul(tf.nn.softmax(logits, axis=-1), v)
  weights = tf.nn.softmax(tf.where(allowed, logits, logits.dtype.min), axis=-1)
  any_allowed = tf.reduce_any(allowed, axis=-1, keepdims=True)
  return tf.matmul(weights, v) * tf.cast(any_allowed, v.dtype)


@translates("aten._softmax.default", "aten.softmax.int")
def _softmax(out, x, dim, *unused):
  if x.shape.rank == 0:  # torch: a 0-d tensor is one class
    return tf.reshape(tf.nn.softmax(tf.reshape(x, [1])), [])
  return tf.nn.softmax(x, axis=dim)


@translates("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(out, x, dim, *unused):
  if x.shape.rank == 0:
    return tf.reshape(tf.nn.log_softmax(tf.reshape(x, [1])), [])
  return tf.nn.log_softmax(x, axis=dim)


@translates("aten.gelu.default", channels_last=True)
def _gelu(out, x, approximate="none"):
  if isinstance(x, ChannelsLast):
    return ChannelsLast(_gelu(out, x.tensor_tf, approximate))
  return tf.nn.gelu(x, approximate=approximate == "tanh")


# --- normalization and embeddings ---------------------------------------------


@translates("aten._native_batch_norm_legit_no_training.default", channels_last=True)
def _batch_norm(out, x, weight, bias, mean, var, momentum, eps):
  del momentum  # eval mode: the running statistics are read, not updated
  if isinstance(x, ChannelsLast):
    x_tf, shape = x.tensor_tf, [-1]
  else:
    x_tf, shape = x, [-1] + [1] * (x.shape.rank - 2)
  scale = tf.math.rsqrt(var + eps)
  if weight is not None:
    scale = scale * weight
  shift = -mean * scale if bias is None else bias - mean * scale
  y_tf = x_tf * tf.reshape(scale, shape) + tf.reshape(shift, shape)
  result = ChannelsLast(y_tf) if isinstance(x, ChannelsLast) else y_tf
  return result, None, None


def _normalized_by_batch(x, weight, bias, eps):
  """`x` normalized by its own statistics over every axis but the channel
  one: (the result, in x's layout; the batch mean, variance and 1/std,
  flat, one per channel; the number of values per channel)."""
  channels_last = isinstance(x, ChannelsLast)
  x_tf = x.tensor_tf if channels_last else x
  channel = x_tf.shape.rank - 1 if channels_last else 1
  axes = [a for a in range(x_tf.shape.rank) if a != channel]
  mean, var = tf.nn.moments(x_tf, axes, keepdims=True)
  rstd = tf.math.rsqrt(var + eps)
  shape = [-1 if a == channel else 1 for a in range(x_tf.shape.rank)]
  y_tf = (x_tf - mean) * rstd
  if weight is not None:
    y_tf = y_tf * tf.reshape(weight, shape)
  if bias is not None:
    y_tf = y_tf + tf.reshape(bias, shape)
  result = ChannelsLast(y_tf) if channels_last else y_tf
  mean_flat = tf.reshape(mean, [-1])
  count = tf.size(x_tf) // tf.size(mean_flat)
  return result, mean_flat, tf.reshape(var, [-1]), tf.reshape(rstd, [-1]), count


@translates("aten._native_batch_norm_legit.no_stats", channels_last=True)
def _batch_norm_batch_stats(out, x, weight, bias, *args):
  """Normalization by the input's own statistics (InstanceNorm's and
  GroupNorm-like uses; BatchNorm in eval mode reads its running ones)."""
  result, mean, _, rstd, _ = _normalized_by_batch(x, weight, bias, args[-1])
  return result, mean, rstd


@translates("aten._native_batch_norm_legit_functional.default", channels_last=True)
def _batch_norm_training(out, x, weight, bias, running_mean, running_var, training, momentum, eps):
  """BatchNorm in training mode: normalized by the batch's statistics, and
  the new running statistics as outputs (torch's functional form: the
  caller assigns them to the buffers' variables)."""
  if not training:
    y_tf, _, _ = _batch_norm(out, x, weight, bias, running_mean, running_var, momentum, eps)
    return y_tf, None, None, running_mean, running_var
  result, mean, var, rstd, count = _normalized_by_batch(x, weight, bias, eps)
  # torch updates the running variance with the unbiased batch variance.
  count = tf.cast(count, var.dtype)
  unbiased = var * count / tf.maximum(count - 1, 1)
  new_mean = (1 - momentum) * running_mean + momentum * tf.cast(mean, running_mean.dtype)
  new_var = (1 - momentum) * running_var + momentum * tf.cast(unbiased, running_var.dtype)
  return result, mean, rstd, new_mean, new_var


@translates("aten.native_dropout.default", random=True)
def _dropout(out, x, p, train, draw=None):
  """Dropout: TF's own random stream (a different draw from torch's, the
  same keep rate). `draw` (the check at capture) is torch's mask, so that
  everything else can be compared value for value."""
  del out
  if not train or p == 0:
    return x, tf.ones_like(x, tf.bool)
  if p >= 1:
    return tf.zeros_like(x), tf.zeros_like(x, tf.bool)
  mask = draw if draw is not None else tf.random.uniform(tf.shape(x), dtype=x.dtype) >= p
  mask = tf.cast(mask, tf.bool)
  return tf.where(mask, x * (1.0 / (1.0 - p)), tf.zeros_like(x)), mask


@translates("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(out, x, normalized_shape, weight=None, bias=None, eps=1e-5, *unused):
  axes = list(range(x.shape.rank - len(normalized_shape), x.shape.rank))
  mean, var = tf.nn.moments(x, axes, keepdims=True)
  rstd = tf.math.rsqrt(var + eps)
  y = (x - mean) * rstd
  if weight is not None:
    y = y * weight
  if bias is not None:
    y = y + bias
  return (y, mean, rstd) if isinstance(out, (tuple, list)) else y


@translates("aten.native_group_norm.default")
def _group_norm(out, x, weight, bias, n, c, hw, groups, eps):
  del n, hw
  shape = tf.shape(x)
  grouped = tf.reshape(x, tf.concat([shape[:1], [groups, -1]], 0))
  mean, var = tf.nn.moments(grouped, [2], keepdims=True)
  rstd = tf.math.rsqrt(var + eps)
  y = tf.reshape((grouped - mean) * rstd, shape)
  channel_shape = [c] + [1] * (x.shape.rank - 2)
  if weight is not None:
    y = y * tf.reshape(weight, channel_shape)
  if bias is not None:
    y = y + tf.reshape(bias, channel_shape)
  return y, tf.squeeze(mean, -1), tf.squeeze(rstd, -1)


@translates("aten.embedding.default")
def _embedding(out, weight, indices, padding_idx=-1, *unused):
  rows = tf.gather(weight, indices)
  if padding_idx is None or padding_idx < 0:
    return rows
  # torch gives the padding row no gradient (BERT's word embeddings).
  padding = tf.expand_dims(tf.equal(indices, tf.cast(padding_idx, indices.dtype)), -1)
  return tf.where(padding, tf.stop_gradient(rows), rows)
