"""The one tolerance table: how close a capture's results must be to
torch's, for `tb.translate` and for both runners' checks of a capture.

In a capture's check an absolute tolerance is scaled by the largest
finite |torch value| of the tensor compared when that is over 1, so a
large output is held to its own precision, not to a fixed number of
decimals; `tb.translate` documents `atol + rtol * |torch|` unscaled
(`scaled=False`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf


class Tolerance(NamedTuple):
  rtol: float
  atol: float  # times max(1, max |torch|)


# dtype -> (outputs and written buffers, gradients)
TOLERANCES = {
  tf.float64: (Tolerance(1e-10, 1e-10), Tolerance(1e-8, 1e-9)),
  tf.float32: (Tolerance(1e-5, 1e-6), Tolerance(1e-4, 1e-5)),
  tf.float16: (Tolerance(1e-2, 1e-3), Tolerance(5e-2, 1e-2)),
  tf.bfloat16: (Tolerance(2e-2, 1e-2), Tolerance(1e-1, 5e-2)),
  tf.complex64: (Tolerance(1e-5, 1e-6), Tolerance(1e-4, 1e-5)),
  tf.complex128: (Tolerance(1e-10, 1e-10), Tolerance(1e-8, 1e-9)),
}
_EXACT = (Tolerance(0.0, 0.0), Tolerance(0.0, 0.0))


class Difference(NamedTuple):
  """`largest`: the largest |got - want| (NaN where both are NaN counts as
  equal; inf for a shape that differs); `ok`: within `tolerance`;
  `bound`: the absolute part of the tolerance, scaled."""

  largest: float
  ok: bool
  tolerance: Tolerance
  bound: float


def tolerance_of(dtype: tf.DType, grads: bool = False) -> Tolerance:
  """The default tolerance of `dtype`'s values (`grads`: of gradients)."""
  return TOLERANCES.get(tf.as_dtype(dtype), _EXACT)[1 if grads else 0]


def difference(
  got: np.ndarray,
  want: np.ndarray,
  dtype: tf.DType,
  grads: bool = False,
  given: Tolerance | None = None,
  scaled: bool = True,
) -> Difference:
  """How far `got` (TF's or the runner's) is from `want` (torch's), against
  `dtype`'s tolerance (or the `given` one); integers and booleans must be
  equal.

  >>> difference(np.float32([1.0, 2.0]), np.float32([1.0, 2.0 + 1e-7]), tf.float32).ok
  True
  >>> difference(np.float32([100.0]), np.float32([100.01]), tf.float32).ok
  False
  """
  tolerance = tolerance_of(dtype, grads) if given is None else given
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return Difference(float("inf"), False, tolerance, 0.0)
  if not np.issubdtype(want.dtype, np.inexact):
    same = bool(np.array_equal(got, want))
    return Difference(0.0 if same else float("inf"), same, Tolerance(0.0, 0.0), 0.0)
  if np.isfinite(want).all() and not np.iscomplexobj(want):
    # One pass for the largest difference, a second only where it exceeds
    # the absolute bound (a model's gradients: ~10^8 elements to check). In
    # float32 below float64: its rounding (6e-8 relative) is far inside
    # every float32 tolerance.
    work = np.float64 if np.float64 in (got.dtype, want.dtype) else np.float32
    scale = max(1.0, float(np.abs(want).max(initial=0.0))) if scaled else 1.0
    bound = tolerance.atol * scale
    apart = np.abs(got.astype(work, copy=False) - want.astype(work, copy=False))
    largest = float(apart.max(initial=0.0))  # nan where got has one
    ok = largest <= bound or bool(
      np.all(apart <= bound + tolerance.rtol * np.abs(want.astype(work, copy=False)))
    )
    return Difference(largest, ok, tolerance, bound)
  got64 = got.astype(np.complex128 if np.iscomplexobj(want) else np.float64)
  want64 = want.astype(got64.dtype)
  finite = np.isfinite(want64)
  scale = max(1.0, float(np.max(np.abs(want64[finite]), initial=0.0))) if scaled else 1.0
  bound = tolerance.atol * scale
  ok = bool(np.allclose(got64, want64, rtol=tolerance.rtol, atol=bound, equal_nan=True))
  largest = float(np.nanmax(np.abs(got64 - want64), initial=0.0)) if got.size else 0.0
  return Difference(largest, ok, tolerance, bound)
