"""Graph calls of one module that writes buffers, one at a time.

In a graph, a call reads the buffers' variables, runs the op and assigns the
buffers the forward wrote. Two graphs running at once (two threads, each
with its `tf.function`) could interleave those steps, and the later assign
would overwrite the earlier call's update. `ExclusiveCalls` wraps the three
steps in a `tf.CriticalSection`, TF's own mutex for graphs: the reads wait
for the lock, and the lock is let go only after the assigns have landed.

The lock lives in the graph, so it orders graph calls against graph calls.
Eager calls take the module's Python lock instead (see
`TorchState.call`).

Example:

  >>> import tensorflow as tf
  >>> counter = tf.Variable(0)
  >>> calls = ExclusiveCalls("counter")
  >>> @tf.function
  ... def step():
  ...   return calls.run(lambda after_writes: after_writes.append(counter.assign_add(1)))
  >>> _ = step(); int(counter.numpy())
  1
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf


class ExclusiveCalls:
  """A `tf.CriticalSection` made on first use, for one module's calls.

  Args:
    owner_name: the wrapper's name, for the section's name in graphs.
  """

  def __init__(self, owner_name: str) -> None:
    self._name = owner_name
    self._section: tf.CriticalSection | None = None
    self._made = threading.Lock()

  def run(self, call: Callable[[list[Any]], Any]) -> Any:
    """Runs `call(after_writes)` inside the section; returns its result.

    `call` appends to `after_writes` tensors that exist only once its
    writes have landed (reads of the variables it assigned); the section is
    let go only after them and after every tensor of the result.
    """
    structure: list[Any] = []

    def inside() -> list[tf.Tensor]:
      after_writes: list[Any] = []
      result = call(after_writes)
      structure.append(result)
      leaves = tf.nest.flatten(result, expand_composites=True)
      tensors = [x for x in leaves if isinstance(x, tf.Tensor)]
      # The section needs at least one tensor to wait for.
      return tensors + after_writes + [tf.constant(0)]

    waited = self._get().execute(inside, exclusive_resource_access=False)
    result = structure[0]
    leaves = tf.nest.flatten(result, expand_composites=True)
    released = iter(waited)
    leaves = [next(released) if isinstance(x, tf.Tensor) else x for x in leaves]
    return tf.nest.pack_sequence_as(result, leaves, expand_composites=True)

  def _get(self) -> tf.CriticalSection:
    with self._made:
      if self._section is None:
        with tf.init_scope():
          self._section = tf.CriticalSection(name=f"{self._name}_calls")
      return self._section
