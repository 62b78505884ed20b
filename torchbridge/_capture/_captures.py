"""One module's captures, by call signature: the key, the store, and the
module held still while one is made.

A capture is keyed on what a graph call bakes in: the torch modes, the
arguments' shapes and dtypes, the non-tensor arguments. It is made on a
thread of its own (eager, with a tape stack of its own: a function being
traced stops the tracing thread's tapes, which the check's gradients
need), with the module held as a graph call runs it (`Holding`), and is
kept with the Python state it read (`_watch.Snapshot`): once that state
changes, the next trace captures again.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)

from torchbridge._capture import _watch
from torchbridge._runtime import _omp_team
from torchbridge._state import _torch_state
from torchbridge._translate import _refusal


class Capture(Protocol):
  seconds: float  # the capture's time: export, lowering and check


T = TypeVar("T", bound=Capture)


def signature_key(call: Any, training: bool | list[bool], mode_key: str) -> tuple[Any, ...]:
  """A capture's key: the torch modes, the arguments' shapes and dtypes,
  and the non-tensor arguments."""
  return (
    mode_key,
    isinstance(training, list),
    tuple((a.shape.rank and tuple(a.shape.as_list()), a.dtype.name) for a in call.args_tf),
    call.static_key(),
  )


class Captures(Generic[T]):
  """One runner's captures of one module: `{key: (capture, Snapshot)}`,
  or `{key: Refusal}` where the signature cannot run on it."""

  def __init__(self) -> None:
    self.entries: dict[Any, tuple[T, _watch.Snapshot] | _refusal.Refusal] = {}

  def get(
    self, key: Any, capture: Callable[[], tuple[T, _watch.Snapshot] | _refusal.Refusal]
  ) -> tuple[T, _watch.Snapshot] | _refusal.Refusal:
    """`entries[key]`, or (none yet, or the Python state it read changed
    since) `capture()` made now on a thread of its own, and kept. That
    thread's OpenMP team (the check ran torch there) is released before it
    ends: left behind, its idle workers made every later parallel region
    of the torch thread pay a futex wake-up (the C++ torch runner's TD3
    step: 9.1 ms, 7.2 ms with it released; `_runtime/_omp_team.py`)."""
    entry = self.entries.get(key)
    if isinstance(entry, tuple) and entry[1].first_change() is not None:
      entry = None  # Python state it read changed: capture again
    if entry is None:

      def on_own_thread() -> tuple[T, _watch.Snapshot] | _refusal.Refusal:
        try:
          return capture()
        finally:
          _omp_team.release_this_threads_team()

      with concurrent.futures.ThreadPoolExecutor(1, "torchbridge-capture") as pool:
        entry = pool.submit(on_own_thread).result()
      self.entries[key] = entry
    return entry

  def __len__(self) -> int:
    return len(self.entries)


class Holding:
  """The module held as a graph call would run it, while a capture is
  made (`TorchState.held`); `changed()` says (as a refusal) what Python
  state the forward changed since (a counter of its own calls, say, which
  no capture holds one value of); once left, `after` is what it read."""

  def __init__(self, state: _torch_state.TorchState, training: bool | list[bool]) -> None:
    self._state = state
    self._training = training
    self.after: _watch.Snapshot | None = None

  def _snapshot(self) -> _watch.Snapshot:
    state = self._state
    return _watch.Snapshot(list(state.module.named_modules()), ignored=state.own_hooks())

  def __enter__(self) -> Holding:
    self._held = self._state.held(self._training)
    self._held.__enter__()
    try:
      self._before = self._snapshot()
    except BaseException:
      self._held.__exit__(None, None, None)
      raise
    return self

  def changed(self) -> _refusal.Refusal | None:
    change = self._before.first_change()
    if change is None:
      return None
    return _refusal.Refusal(
      "check",
      f"the forward changed its Python state while captured: {change}; a capture would "
      "keep one value",
    )

  def __exit__(self, *exc_info: Any) -> None:
    try:
      self.after = self._snapshot()
    finally:
      self._held.__exit__(*exc_info)


def capture_held(
  state: _torch_state.TorchState,
  training: bool | list[bool],
  make: Callable[[], T],
  what_else: str,
) -> tuple[T, _watch.Snapshot] | _refusal.Refusal:
  """`make()` with the module held (`Holding`), and the Python state it
  read; or why the signature has no capture: `make`'s `Refusal`, the
  forward changing its own Python state, or any other error (a limit of
  the runner: a `Refusal` of kind `what_else`)."""
  start = time.perf_counter()
  with Holding(state, training) as held:
    try:
      made = make()
      changed = held.changed()
      if changed is not None:
        return changed
    except _refusal.Refusal as refusal:
      return refusal
    except Exception as err:  # pylint: disable=broad-except
      said = f"{type(err).__name__}: {err}"
      return _refusal.Refusal(what_else, f"the capture raised {said}", said)
  made.seconds = time.perf_counter() - start
  assert held.after is not None
  return made, held.after
