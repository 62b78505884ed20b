"""The exchange counters: how many tensors crossed, and how (exchange_stats)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

# Reentrant: a garbage collection that runs while this thread holds it may
# run a finalizer that counts (a wrapper's copy-back, _state._torch_views).
_stats_lock = threading.RLock()
_stats = {"zero_copy": 0, "copied": 0, "bytes_copied": 0}
_KEYS = ("zero_copy", "copied", "bytes_copied")
# Counters kept outside Python (crossings made in C++): callables returning
# running counts, one per key, and their sums at the last reset.
_sources: list[Callable[[], tuple[int, int, int]]] = []
_baseline = [0, 0, 0]


def exchange_stats() -> dict[str, int]:
  """Returns how many tensors crossed the boundary, and how.

  Every tensor handed from one framework to the other is counted once: as
  `zero_copy` when both sides share its memory, as `copied` (with its size in
  `bytes_copied`) when the memory did not allow sharing (misaligned views,
  non-contiguous or negatively strided layouts, read-only numpy buffers).

  Returns:
    A new dict `{"zero_copy": int, "copied": int, "bytes_copied": int}`.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> tb.reset_exchange_stats()
    >>> _ = tb.to_torch(tf.ones([4]))
    >>> tb.exchange_stats()
    {'zero_copy': 1, 'copied': 0, 'bytes_copied': 0}
  """
  with _stats_lock:
    external = _external()
    return {key: _stats[key] + external[i] for i, key in enumerate(_KEYS)}


def reset_exchange_stats() -> None:
  """Sets every counter of `exchange_stats()` back to zero.

  Examples:
    >>> import torch, torchbridge as tb
    >>> _ = tb.to_tf(torch.ones(3))
    >>> tb.reset_exchange_stats()
    >>> tb.exchange_stats()
    {'zero_copy': 0, 'copied': 0, 'bytes_copied': 0}
  """
  with _stats_lock:
    for key in _stats:
      _stats[key] = 0
    for i, n in enumerate(_external()):
      _baseline[i] += n


def add_source(counts: Callable[[], tuple[int, int, int]]) -> None:
  """Adds `counts() -> (zero_copy, copied, bytes_copied)`, running counts
  of crossings made outside Python, to `exchange_stats()` from now on."""
  with _stats_lock:
    _sources.append(counts)
    for i, n in enumerate(counts()):
      _baseline[i] += n


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
  """Crossings made inside are left out of `exchange_stats()` (a capture's
  check against the Python path, which is no call of the user's): the
  counters are where they were before (crossings that other threads make
  meanwhile are left out too)."""
  with _stats_lock:
    before = dict(_stats)
    external_before = _external()
  try:
    yield
  finally:
    with _stats_lock:
      _stats.update(before)
      for i, (now, then) in enumerate(zip(_external(), external_before)):
        _baseline[i] += now - then


def _external() -> list[int]:
  totals = [sum(column) for column in zip((0, 0, 0), *(counts() for counts in _sources))]
  return [total - base for total, base in zip(totals, _baseline)]


def count_zero_copy(n: int) -> None:
  """Counts `n` tensors that crossed without a copy (made outside this file)."""
  with _stats_lock:
    _stats["zero_copy"] += n


def count(copied_bytes: int | None = None) -> None:
  """Counts one tensor crossing: a copy of `copied_bytes`, or (None) none."""
  with _stats_lock:
    if copied_bytes is None:
      _stats["zero_copy"] += 1
    else:
      _stats["copied"] += 1
      _stats["bytes_copied"] += copied_bytes
