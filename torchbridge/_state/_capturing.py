"""What both runners' captures share: the key, the cache (a capture made
on a thread of its own), the module held ready to be captured, and the
buffers a captured call wrote assigned to their variables."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._runtime import _omp_team
from torchbridge._state import _module_checks
from torchbridge._state import _watch


def assign_writes(
  state: Any,
  writes: dict[str, tf.Tensor],
  mutated_buffers: dict[str, frozenset[str]],
  mode_key: str,
  after_writes: list[Any] | None,
) -> None:
  """Assigns the buffers a captured call wrote to their variables, as the
  Python path does: noted in `mutated_buffers` for the mode, their new
  values appended to `after_writes` (the call's critical section)."""
  mutated_buffers[mode_key] = frozenset(writes)
  for name, value_tf in writes.items():
    variable = state.variables[name]
    variable.assign(value_tf)
    if after_writes is not None:
      after_writes.append(tf.convert_to_tensor(variable))


def signature_key(call: Any, training: bool | list[bool], mode_key: str) -> tuple[Any, ...]:
  """A capture's key: the torch modes, the arguments' shapes and dtypes,
  and the non-tensor arguments."""
  return (
    mode_key,
    isinstance(training, list),
    tuple((tuple(a.shape.as_list()), a.dtype.name) for a in call.args_tf),
    call.static_key(),
  )


def cached_capture(captures: dict[Any, Any], key: Any, capture: Any, *args: Any) -> Any:
  """`captures[key]`, or (none yet, or the Python state it read has
  changed since) `capture(*args)` made now and kept there. A capture runs
  on a thread of its own: eager, and with a tape stack of its own (a
  function being traced stops the tracing thread's tapes, which the
  check's gradients need). That thread's OpenMP team (the check ran torch
  there) is released before it ends: left behind, its idle workers made
  every later parallel region of the torch thread pay a futex wake-up
  (the C++ torch runner's TD3 step: 9.1 ms, 7.2 ms with it released;
  `_runtime/_omp_team.py`)."""
  entry = captures.get(key)
  if isinstance(entry, tuple) and entry[1].first_change() is not None:
    entry = None  # Python state it read changed: capture again
  if entry is None:

    def on_own_thread() -> Any:
      try:
        return capture(*args)
      finally:
        _omp_team.release_this_threads_team()

    with concurrent.futures.ThreadPoolExecutor(1, "torchbridge-capture") as pool:
      entry = pool.submit(on_own_thread).result()
    captures[key] = entry
  return entry


class Capturing:
  """The module ready to be captured, as a graph call would run it: under
  its state's lock, its tensors viewing the variables' values,
  torchbridge's own hooks suspended, the call's modes set. `changed()`
  says (as a refusal's reason) what Python state the forward changed
  since it was entered, a counter of its own calls say, which no capture
  holds one value of; after it is left, `after` is what a capture read."""

  def __init__(self, state: Any, training: bool | list[bool]) -> None:
    self._state = state
    self._training = training
    self.after: _watch.Snapshot | None = None

  def _snapshot(self) -> _watch.Snapshot:
    state = self._state
    return _watch.Snapshot(
      list(state.module.named_modules()),
      ignored=frozenset(state._views.hook_ids()),  # pylint: disable=protected-access
    )

  def __enter__(self) -> Capturing:
    state = self._state
    state._lock.acquire()  # pylint: disable=protected-access
    try:
      views = state._views  # pylint: disable=protected-access
      views.lend()
      views.suspend_hooks()
      self._saved = _module_checks.set_modes(state.module, state._modules, self._training)  # pylint: disable=protected-access
      self._before = self._snapshot()
    except BaseException:
      state._lock.release()  # pylint: disable=protected-access
      raise
    return self

  def changed(self) -> str | None:
    change = self._before.first_change()
    if change is None:
      return None
    return (
      f"the forward changed its Python state while captured: {change}; a "
      "capture would keep one value"
    )

  def __exit__(self, *exc_info: Any) -> None:
    state = self._state
    try:
      if self._saved is not None:
        _module_checks.restore_modes(self._saved)
      state._views.resume_hooks()  # pylint: disable=protected-access
      self.after = self._snapshot()
    finally:
      state._lock.release()  # pylint: disable=protected-access
