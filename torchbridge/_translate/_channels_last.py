"""Channels-last values: torch (N, C, *spatial) tensors held by TF as
(N, *spatial, C) between the ops that can work in that layout.

TF's CPU convolutions and pooling run NHWC only. A translated NCHW graph
keeps the channels-last result of a convolution as a `ChannelsLast` and
hands it on to every layout-agnostic op (activations, elementwise
arithmetic with scalars or other channels-last values, batch norm, pooling,
keep-dims reductions); the first op that needs torch's layout (a `view`, a
`linear`, an output) transposes it back once. A chain conv -> batch norm ->
relu -> pool -> conv thus costs one transpose in and one out.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class ChannelsLast:
  """A torch-layout (N, C, *spatial) tensor, held as (N, *spatial, C).

  Examples:
    >>> import tensorflow as tf
    >>> x_nchw_tf = tf.reshape(tf.range(24.), [1, 2, 3, 4])
    >>> value = ChannelsLast(to_channels_last(x_nchw_tf))
    >>> value.tensor_tf.shape.as_list()
    [1, 3, 4, 2]
    >>> bool(tf.reduce_all(to_torch_layout(value) == x_nchw_tf))
    True
  """

  __slots__ = ("tensor_tf",)

  def __init__(self, tensor_tf: tf.Tensor) -> None:
    self.tensor_tf = tensor_tf

  @property
  def rank(self) -> int:
    return self.tensor_tf.shape.rank


def to_channels_last(value: tf.Tensor | ChannelsLast) -> tf.Tensor:
  """The (N, *spatial, C) TF tensor of a torch-layout tensor or a
  `ChannelsLast`."""
  if isinstance(value, ChannelsLast):
    return value.tensor_tf
  rank = value.shape.rank
  return tf.transpose(value, [0, *range(2, rank), 1])


def to_torch_layout(value: Any) -> Any:
  """`value` in torch's layout: `ChannelsLast` values transposed back,
  anything else (also inside lists and tuples) as it is."""
  if isinstance(value, ChannelsLast):
    rank = value.rank
    return tf.transpose(value.tensor_tf, [0, rank - 1, *range(1, rank - 1)])
  if isinstance(value, (list, tuple)):
    return type(value)(to_torch_layout(v) for v in value)
  if isinstance(value, dict):
    return {k: to_torch_layout(v) for k, v in value.items()}
  return value


def tf_axis(torch_axis: int, rank: int) -> int:
  """The axis of a `ChannelsLast` tensor holding torch's `torch_axis`."""
  torch_axis %= rank
  if torch_axis == 0:
    return 0
  return rank - 1 if torch_axis == 1 else torch_axis - 1
