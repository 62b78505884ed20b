"""Python run before each call of a traced graph (a call-time capture).

A graph that holds a captured module call, or that reads or writes a
wrapped module's variables, needs Python to run before each of its calls:
the check that what a capture read is unchanged (`_capture/_guard.py`),
the torch views of the variables taken back (`_write_watch.py`). TF runs a
call-time capture's function before every call of the outermost
`tf.function`, XLA's included; `before_each_call` adds one such capture to
the graph being traced and runs every callback registered on it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._frameworks import _compat

_ZERO: list[tf.Tensor] = []

# graph -> {key: callback}: what its one call-time capture runs, in order.
_CALLBACKS: weakref.WeakKeyDictionary[Any, dict[Any, Callable[[], None]]] = (
  weakref.WeakKeyDictionary()
)


class CheckType(tf.types.experimental.TraceType):
  """The call-time capture's type: an int32 scalar whose TraceType
  methods do nothing they need not.

  TF runs a call-time capture's type on every call of the function (its
  `cast` and `to_tensors`, and its hash and comparisons in the lookup of
  the traced function): a `tf.TensorSpec`'s are Python that validates the
  value, 84 of the 217 Python calls the capture adds to a call (counted
  by cProfile; in wall time within this machine's noise,
  benchmarks/guard_cost.py). The capture always returns the same eager
  int32 scalar (`_ZERO`), so there is nothing to validate."""

  _SPEC = tf.TensorSpec([], tf.int32)

  def is_subtype_of(self, other: Any) -> bool:
    return isinstance(other, CheckType)

  def most_specific_common_supertype(self, others: Any) -> Any:
    return self if all(isinstance(o, CheckType) for o in others) else None

  def placeholder_value(self, placeholder_context: Any) -> Any:
    return self._SPEC.placeholder_value(placeholder_context)

  def to_tensors(self, value: Any) -> list[Any]:
    return [value]

  def from_tensors(self, tensors: Any) -> Any:
    return next(tensors)

  def flatten(self) -> list[Any]:
    return [self._SPEC]

  def cast(self, value: Any, casting_context: Any) -> Any:
    return value

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, CheckType)

  def __hash__(self) -> int:
    return hash(CheckType)

  def __repr__(self) -> str:
    return "torchbridge check (int32 scalar)"


def before_each_call(key: Any, callback: Callable[[], None]) -> None:
  """Makes every call of the `tf.function` being traced run `callback()`
  first (once per `key` a graph; the first callback given for a key is
  kept). Nothing outside a `tf.function` trace, or in a SavedModel's
  trace (a SavedModel runs without the Python objects)."""
  if _compat.in_saved_model_trace():
    return
  graph = _compat.function_graph()
  if not hasattr(graph, "capture_call_time_value"):
    return  # a TF1 graph: no calls of it reach Python
  callbacks = _CALLBACKS.get(graph)
  if callbacks is None:
    if not _ZERO:
      with tf.init_scope():
        _ZERO.append(tf.constant(0))
    callbacks = _CALLBACKS[graph] = {}
    registered = callbacks.values()

    def run_callbacks() -> tf.Tensor:
      for run in list(registered):
        run()
      return _ZERO[0]

    with graph.as_default():
      # default_value: what `tf.saved_model.save` feeds a function traced
      # before it (a SavedModel runs without the Python objects).
      graph.capture_call_time_value(
        run_callbacks, CheckType(), key="torchbridge check", default_value=_ZERO[0]
      )
  callbacks.setdefault(key, callback)
