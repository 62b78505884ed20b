"""Which arguments of a call get gradients, and where gradients go."""

from __future__ import annotations

from collections.abc import Sequence

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._frameworks import _compat


def is_differentiable(dtype: tf.DType) -> bool:
  """Whether gradients flow through values of this TF dtype."""
  return tf.as_dtype(dtype).is_floating


# Graph ops whose output no gradient reaches.
_GRADIENT_STOPPERS = frozenset(("StopGradient", "PreventGradient"))


def can_get_gradients(args_tf: Sequence[tf.Tensor], differentiable: Sequence[bool]) -> list[bool]:
  """`differentiable`, narrowed to the arguments a gradient can be asked for.

  Eagerly, the ones a tape watches (when no tape records, none: the call
  builds no autograd graph); in a graph, those that are not the output of
  `tf.stop_gradient`. torch then makes leaves only of those, so code that
  torch cannot differentiate with respect to an unwatched argument (a
  loss's target) runs under a tape too.
  """
  if tf.executing_eagerly():
    if not _compat.tape_could_record():
      return [False] * len(differentiable)
    return [diff and _compat.tape_watches(a) for a, diff in zip(args_tf, differentiable)]
  return [diff and a.op.type not in _GRADIENT_STOPPERS for a, diff in zip(args_tf, differentiable)]


def grad_positions(
  out_specs: Sequence[tf.TensorSpec],
  differentiable: Sequence[bool],
  dys_tf: Sequence[tf.Tensor | None],
) -> tuple[list[int], list[int]]:
  """Which outputs send gradient back, and which arguments receive it."""
  sel_out = [
    i
    for i, (spec, dy) in enumerate(zip(out_specs, dys_tf))
    if dy is not None and is_differentiable(spec.dtype)
  ]
  diff_args = [j for j, diff in enumerate(differentiable) if diff]
  return sel_out, diff_args


def scatter(
  grads_tf: Sequence[tf.Tensor | None], positions: Sequence[int], n: int
) -> list[tf.Tensor | None]:
  result = [None] * n
  for pos, g in zip(positions, grads_tf):
    result[pos] = g
  return result
