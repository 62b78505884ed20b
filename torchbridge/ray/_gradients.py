"""A loss's gradients w.r.t. a `TorchModule`'s parameters, keyed by torch name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
  import torch

  from torchbridge._wrappers._module import TorchModule


def named_variables(module: TorchModule, trainable_only: bool = False) -> list[tuple[str, Any]]:
  """`[(torch name, tf.Variable)]` for `module.variables` (or trainable ones).

  The names are the torch paths the `TorchModule` made its variables for
  (parameters, then buffers), which is what the other processes know each
  tensor by.
  """
  # pylint: disable=protected-access  (the TorchModule's own name mapping)
  return [(n, v) for n, v in module._state.variables.items() if v.trainable or not trainable_only]


def named_buffers(module: TorchModule, module_torch: torch.nn.Module) -> list[tuple[str, Any]]:
  """`[(torch name, tf.Variable)]` for the buffers of `module_torch`.

  Buffers (BatchNorm running statistics, counters) are what a forward may
  write; frozen parameters are left out, since nothing changes them.
  """
  buffer_names = {n for n, _ in module_torch.named_buffers()}
  return [(n, v) for n, v in named_variables(module) if n in buffer_names]


def average_buffers(
  results: Sequence[Mapping[str, np.ndarray]], num_samples: Sequence[int]
) -> dict[str, np.ndarray]:
  """The workers' buffer values merged into one `{name: np.ndarray}`.

  Values all workers agree on are kept as they are (counters, buffers the
  forward does not write); other floating values (running statistics) are
  averaged weighted by the samples each worker saw; other integer values
  come from worker 0.
  """
  total = sum(num_samples)
  merged: dict[str, Any] = {}  # arrays (mypy types `sum()` of arrays as `ndarray | 0`)
  for name, first in results[0].items():
    values = [r[name] for r in results]
    if all(np.array_equal(first, v) for v in values[1:]) or not np.issubdtype(
      first.dtype, np.floating
    ):
      merged[name] = first
    else:
      merged[name] = sum(v * (n / total) for v, n in zip(values, num_samples))
  return merged


class Gradients:
  """`loss_fn(module, *batch)` and its gradients, as numpy, by torch name.

  Args:
    module: the `tb.TorchModule`.
    loss_fn: `loss_fn(module, *batch_tf)` -> scalar TF loss, the mean over
      the batch's samples.
    tf_function: run the forward and backward in one `tf.function`
      (retraced only for new input shapes); False runs them eagerly, for a
      `loss_fn` that cannot be traced.
  """

  def __init__(
    self, module: TorchModule, loss_fn: Callable[..., Any], tf_function: bool = True
  ) -> None:
    self._module = module
    self._loss_fn = loss_fn
    named = named_variables(module, trainable_only=True)
    self.names = [n for n, _ in named]
    self._variables = [v for _, v in named]
    self._run = (
      tf.function(self._loss_and_grads, reduce_retracing=True)
      if tf_function
      else self._loss_and_grads
    )

  def _loss_and_grads(self, batch_tf: tuple[Any, ...]) -> tuple[tf.Tensor, list[tf.Tensor]]:
    with tf.GradientTape() as tape:
      loss_tf = self._loss_fn(self._module, *batch_tf)
    loss_tf = tf.convert_to_tensor(loss_tf)
    if loss_tf.shape.rank != 0 or not loss_tf.dtype.is_floating:
      raise ValueError(
        f"loss_fn must return a scalar floating loss (the mean over the "
        f"batch), got a {loss_tf.dtype.name} tensor of shape "
        f"{loss_tf.shape}. Reduce it, e.g. tf.reduce_mean(...)."
      )
    grads_tf = tape.gradient(
      loss_tf, self._variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    return loss_tf, [tf.convert_to_tensor(g) for g in grads_tf]

  def __call__(self, batch_tf: Sequence[Any]) -> tuple[float, dict[str, np.ndarray]]:
    """`(loss, {torch name: np.ndarray})` on one batch (a tuple of tensors)."""
    loss_tf, grads_tf = self._run(tuple(batch_tf))
    grads_np = {n: np.asarray(g.numpy()) for n, g in zip(self.names, grads_tf)}
    return float(loss_tf.numpy()), grads_np
