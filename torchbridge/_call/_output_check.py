"""Checks a call's torch outputs against the specs declared at trace time,
and says how to fix a mismatch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchbridge._call import _signature
from torchbridge._crossing import _adopt

if TYPE_CHECKING:
  import torch
  import tensorflow as tf


class OutputCheck:
  """Checks a call's torch outputs against the specs declared at trace time.

  The specs are turned into plain tuples once, so the check costs little on
  every run.
  """

  def __init__(self, out_specs: Sequence[tf.TensorSpec], name: str, specs_found: str) -> None:
    self._specs = out_specs
    self._name = name
    self._found = specs_found
    # (torch dtype, the rank or None where unknown, ((index, size), ...) of
    # the known dimensions).
    self._expected = [
      (
        _adopt.torch_dtype(s.dtype),
        s.shape.rank,
        ()
        if s.shape.rank is None
        else tuple((i, d) for i, d in enumerate(s.shape.as_list()) if d is not None),
      )
      for s in out_specs
    ]
    # The common case, one output of a fully known shape: (dtype, dims).
    self._single = None
    if len(out_specs) == 1 and out_specs[0].shape.is_fully_defined():
      self._single = (self._expected[0][0], tuple(out_specs[0].shape.as_list()))

  def __call__(self, outs_torch: Sequence[torch.Tensor | None]) -> None:
    # Loops, not generators or helpers: this runs on every call, where each
    # Python frame costs (docs/performance/timeline.md, "Per call").
    if self._single is not None and len(outs_torch) == 1:
      out = outs_torch[0]
      if out is not None and out.dtype == self._single[0] and out.shape == self._single[1]:
        return
    if len(outs_torch) == len(self._expected):
      for out, (dtype, rank, known) in zip(outs_torch, self._expected):
        if out is None:  # left out because nothing consumes it
          continue
        shape = out.shape
        if out.dtype != dtype or (rank is not None and len(shape) != rank):
          break
        for i, size in known:
          if shape[i] != size:
            break
        else:
          continue
        break
      else:
        return
    _check_outputs(outs_torch, self._specs, self._name, self._found)


def _check_outputs(
  outs_torch: Sequence[torch.Tensor | None],
  out_specs: Sequence[tf.TensorSpec],
  name: str,
  found: str,
) -> None:
  """Raises the error that says how the outputs differ from the specs."""
  if len(outs_torch) != len(out_specs):
    raise ValueError(
      f"{name} returned {len(outs_torch)} tensors, but {len(out_specs)} "
      "were declared when the tf.function was traced. The torch code must "
      "return the same structure on every call."
    )
  for k, (out, spec) in enumerate(zip(outs_torch, out_specs)):
    if out is None:  # left out because nothing consumes it
      continue
    if out.dtype != _adopt.torch_dtype(spec.dtype):
      raise TypeError(
        f"{name} output {k} has dtype {out.dtype}, but {spec.dtype.name} "
        f"was declared when the tf.function was traced ({found}). "
        f"{_WAY_OUT[found]}"
      )
    if not spec.shape.is_compatible_with(out.shape):
      raise ValueError(
        f"{name} output {k} has shape {tuple(out.shape)}, but "
        f"{spec.shape} was declared when the tf.function was traced "
        f"({found}). {_WAY_OUT[found]}"
      )


# What to do when a call's outputs differ from the specs, by how the specs
# were found.
_WAY_OUT = {
  _signature.META: (
    "Torch's meta kernel of an op in this code gives another shape or "
    "dtype than its CPU/CUDA kernel, or the shape depends on the values. "
    "Declare the outputs: pass output_signature= (None for dimensions "
    "that vary) to tb.torch_function / tb.TorchModule / TorchLayer."
  ),
  _signature.REAL: (
    "The shape depends on the values, which the stand-in run could not "
    "know. Declare the outputs: pass output_signature= (None for "
    "dimensions that vary) to tb.torch_function / tb.TorchModule / "
    "TorchLayer."
  ),
  _signature.DECLARED: (
    "Return what output_signature declares, or fix output_signature "
    "(None for dimensions that vary)."
  ),
}
