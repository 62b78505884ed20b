"""Checks of the weights `set_weights` receives, before any is set."""

from __future__ import annotations

import collections.abc
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._crossing import _exchange

from torchbridge._state import _module_checks


def values_to_set(
  weights: Any, state_names: Mapping[str, str], variables: Mapping[str, Any], owner_name: str
) -> dict[str, np.ndarray]:
  """`{canonical name: array}` for `set_weights(weights)`, or raises.

  Args:
    weights: what the user passed, `{state_dict name: array}`.
    state_names: state_dict name -> canonical name (tied tensors share one).
    variables: canonical name -> the variable holding it.
    owner_name: the wrapper's name, for errors.

  Raises:
    TypeError: `weights` is not a mapping.
    ValueError: names missing or unexpected, shapes that do not fit, tied
      names with different values; every problem is listed, nothing is set.
  """
  if not isinstance(weights, collections.abc.Mapping):
    raise TypeError(
      f"{owner_name}.set_weights() expects a mapping from torch "
      f"state_dict names to arrays, got {type(weights).__name__}. Pass "
      "the dict that get_weights() returns, or a torch state_dict."
    )
  expected = set(state_names)
  missing = sorted(expected - set(weights))
  unexpected = sorted(set(weights) - expected)
  problems = []
  if missing:
    problems.append(f"missing names: {missing}")
  if unexpected:
    problems.append(f"unexpected names: {unexpected}")
  values: dict[str, np.ndarray] = {}
  first_name: dict[str, str] = {}  # canonical name -> the state_dict name that set it
  for n in sorted(expected & set(weights)):
    var = variables[state_names[n]]
    value = _module_checks.as_numpy(weights[n], n, owner_name)
    if tuple(value.shape) != tuple(var.shape):
      problems.append(f"{n!r} has shape {tuple(value.shape)}, expected {tuple(var.shape)}")
      continue
    canonical = state_names[n]
    if canonical in values:
      if not np.array_equal(values[canonical], value):
        problems.append(
          f"{first_name[canonical]!r} and {n!r} are one tied tensor in "
          "torch but have different values"
        )
      continue
    values[canonical] = value
    first_name[canonical] = n
  if problems:
    raise ValueError(
      f"{owner_name}.set_weights() got weights that do not fit the torch "
      f"module: {'; '.join(problems)}. Expected exactly the names of "
      f"its state_dict: {sorted(expected)}."
    )
  return values


def current(state_names: Mapping[str, str], variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """`{state_dict name: np.ndarray}`, copies of the variables' values."""
  return {n: np.array(variables[c].numpy(), copy=True) for n, c in state_names.items()}


def assign(
  weights: Mapping[str, Any],
  state_names: Mapping[str, str],
  variables: Mapping[str, Any],
  owner: str,
) -> None:
  """Sets every variable from `{state_dict name: array}`, all or nothing."""
  for canonical, value in values_to_set(weights, state_names, variables, owner).items():
    var = variables[canonical]
    dtype = tf.as_dtype(var.dtype)
    var.assign(_exchange.tf_owned(tf.constant(value.astype(dtype.as_numpy_dtype))))
