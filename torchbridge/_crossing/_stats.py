"""The exchange counters: how many tensors crossed, and how (exchange_stats)."""

from __future__ import annotations

import threading
from collections.abc import Callable

_stats_lock = threading.Lock()
_stats = {"zero_copy": 0, "copied": 0, "bytes_copied": 0}
# Counters kept outside Python (the native op's C++ crossings): callables
# returning a running count, and their sum at the last reset.
_zero_copy_sources: list[Callable[[], int]] = []
_zero_copy_baseline = 0


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
    stats = dict(_stats)
    stats["zero_copy"] += _external_zero_copy()
    return stats


def reset_exchange_stats() -> None:
  """Sets every counter of `exchange_stats()` back to zero.

  Examples:
    >>> import torch, torchbridge as tb
    >>> _ = tb.to_tf(torch.ones(3))
    >>> tb.reset_exchange_stats()
    >>> tb.exchange_stats()
    {'zero_copy': 0, 'copied': 0, 'bytes_copied': 0}
  """
  global _zero_copy_baseline
  with _stats_lock:
    for key in _stats:
      _stats[key] = 0
    _zero_copy_baseline += _external_zero_copy()


def add_zero_copy_source(count: Callable[[], int]) -> None:
  """Adds `count() -> int`, a running count of zero-copy crossings made
  outside Python, to `exchange_stats()` from now on."""
  global _zero_copy_baseline
  with _stats_lock:
    _zero_copy_sources.append(count)
    _zero_copy_baseline += count()


def _external_zero_copy() -> int:
  return sum(count() for count in _zero_copy_sources) - _zero_copy_baseline


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
