"""A translation's inputs: the input signature checked, and example or
random torch tensors of it (for `torch.export` and the checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf


def check_signature(input_signature: Any) -> list[tf.TensorSpec]:
  """The specs as a list of `tf.TensorSpec`, or a precise error."""
  if isinstance(input_signature, tf.TensorSpec):
    input_signature = [input_signature]
  if not isinstance(input_signature, (list, tuple)) or not all(
    isinstance(s, tf.TensorSpec) for s in input_signature
  ):
    raise TypeError(
      "translate(input_signature): expected a list of tf.TensorSpec, one "
      f"per positional input of the forward; got {input_signature!r}. "
      "Example: input_signature=[tf.TensorSpec([None, 3], tf.float32)]."
    )
  for k, spec in enumerate(input_signature):
    if spec.shape.rank is None:
      raise ValueError(
        f"translate(input_signature): spec {k} ({spec}) has an unknown "
        "rank; give every dimension, with None for a dynamic size, e.g. "
        "tf.TensorSpec([None, 3], tf.float32)."
      )
  return list(input_signature)


def example_inputs(
  specs: Sequence[tf.TensorSpec], given: Sequence[Any] | None
) -> list[torch.Tensor]:
  """torch tensors for export and the parity check: `given`, or random
  values with 2 for dynamic batch sizes and 3 for other dynamic sizes."""
  if given is not None:
    if len(given) != len(specs):
      raise ValueError(
        f"translate(example_inputs): expected {len(specs)} inputs, one per "
        f"spec of input_signature, got {len(given)}."
      )
    tensors = []
    for k, (value, spec) in enumerate(zip(given, specs)):
      array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
      if not spec.shape.is_compatible_with(array.shape):
        raise ValueError(
          f"translate(example_inputs): input {k} has shape "
          f"{list(array.shape)}, which does not fit input_signature "
          f"{spec.shape}."
        )
      tensors.append(torch.from_numpy(array.astype(spec.dtype.as_numpy_dtype)))
    return tensors
  return random_inputs(specs)


def random_inputs(
  specs: Sequence[tf.TensorSpec], size: int = 0, seed: int = 0
) -> list[torch.Tensor]:
  """Random torch tensors of `specs` (normal floats, integers 0 and 1,
  random booleans); an unknown dimension has 2 elements (the first) or 3,
  one more each with size=1 (a second size to check a capture at)."""
  rng = np.random.default_rng(seed + size)
  tensors = []
  for spec in specs:
    shape = [
      (2 + size if a == 0 else 3 + size) if d is None else d
      for a, d in enumerate(spec.shape.as_list())
    ]
    dtype = spec.dtype.as_numpy_dtype
    if spec.dtype.is_floating:
      array = rng.standard_normal(shape).astype(dtype)
    elif spec.dtype == tf.bool:
      array = rng.integers(0, 2, shape).astype(bool)
    else:
      array = rng.integers(0, 2, shape).astype(dtype)
    tensors.append(torch.from_numpy(array))
  return tensors
