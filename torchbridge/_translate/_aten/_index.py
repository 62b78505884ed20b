"""Translations of ATen's indexing ops: advanced indexing, index_select and
gather (see `_table` for the form)."""

import tensorflow as tf

from torchbridge._translate import _refusal
from torchbridge._translate._aten._table import translates, dim_size


@translates("aten.index.Tensor")
def _index(out, x, indices):
  rank = x.shape.rank
  indices = list(indices) + [None] * (rank - len(indices))
  axes = [a for a, i in enumerate(indices) if i is not None]
  if any(indices[a].dtype == tf.bool for a in axes):
    raise _refusal.Refusal("op", "boolean mask indexing (data-dependent shape)")
  # torch counts negative indices from the end; TF's gathers refuse them.
  index = [
    tf.where(indices[a] < 0, indices[a] + tf.cast(dim_size(x, a), indices[a].dtype), indices[a])
    for a in axes
  ]
  if len(axes) == 1:
    return tf.gather(x, index[0], axis=axes[0])
  rest = [a for a in range(rank) if a not in axes]
  shape = tf.shape(index[0])
  for i in index[1:]:
    shape = tf.broadcast_dynamic_shape(shape, tf.shape(i))
  stacked = tf.stack([tf.broadcast_to(tf.cast(i, tf.int64), shape) for i in index], axis=-1)
  y = tf.gather_nd(tf.transpose(x, axes + rest), stacked)  # (*B, *rest)
  if axes == list(range(axes[0], axes[-1] + 1)) and axes[0] > 0:
    # Adjacent index tensors: torch puts B where the indexed axes were.
    nb, p = max(i.shape.rank for i in index), axes[0]
    y = tf.transpose(y, [*range(nb, nb + p), *range(nb), *range(nb + p, nb + len(rest))])
  return y


@translates("aten.index_select.default")
def _index_select(out, x, dim, index):
  return tf.gather(x, index, axis=dim)


@translates("aten.gather.default")
def _gather(out, x, dim, index, sparse_grad=False):
  return (
    tf.gather(x, index, axis=dim % x.shape.rank, batch_dims=dim % x.shape.rank)
    if index.shape.rank == 1
    else _gather_nd(x, dim % x.shape.rank, index)
  )


def _gather_nd(x, dim, index):
  # torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] (for dim=1).
  grids = tf.meshgrid(
    *[tf.range(dim_size(index, a)) for a in range(index.shape.rank)], indexing="ij"
  )
  grids[dim] = tf.cast(index, grids[0].dtype)
  return tf.gather_nd(x, tf.stack(grids, axis=-1))
