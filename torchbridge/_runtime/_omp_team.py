"""Idle OpenMP teams released: the user's thread's when a graph call is
traced, the torch thread's when it has had no work for a moment.

torch's intra-op parallelism (libgomp in the Linux wheels) keeps a team of
worker threads per thread that starts a parallel region. Graph calls run on
the torch thread (`_placement`), whose team is a second one beside the
team the user's thread made (weight init, any torch op on 2+ threads). With
more OpenMP threads in the process than cores, libgomp throttles how long
an idle worker spins before it sleeps (1,000 spins instead of 300,000), so
every parallel region of the torch thread then pays a futex wake-up per
worker. Measured (2 cores, TD3's step, 2 threads each): the same module
forwards took 4.5-6.0 ms a step inside the bridge against 2.2-2.8 ms in
pure torch, which reads 5.5 ms itself with `OMP_WAIT_POLICY=PASSIVE`; with
the user's team released, 2.8 ms.

So when the user's thread traces a bridged call into a `tf.function`, its
idle team is released (`omp_pause_resource_all(omp_pause_soft)`, OpenMP
5.0, which frees the calling thread's pool only). libgomp makes a new one
if that thread runs a parallel region again (about 0.1 ms). Eager calls
run on the user's thread and make its team again (a batch-of-one MLP forward
does); while graph calls are in use, each releases it after it
(`_placement.eager_call_done`), and the next makes it again (0.2-0.3 ms a
call on 2 cores).

The same holds the other way: torch code the user's thread runs right after
bridged graph calls met the torch thread's team, still alive, and ran at
half speed (a small-MLP forward and backward: 1,100 against 450 us). So the
torch thread releases its own team after 5 ms without work (C++:
`csrc/torch_thread.h`, through `pause_address()`; Python:
`_torch_thread.py`), and makes a new one with its next call.

Set `TORCHBRIDGE_RELEASE_USER_TEAM=0` to keep every team.
"""

from __future__ import annotations

import ctypes
import os
import threading

from typing import Any

import torch

ENV = "TORCHBRIDGE_RELEASE_USER_TEAM"
_OMP_PAUSE_SOFT = 1

_lock = threading.Lock()
# omp_pause_resource_all of torch's OpenMP (a ctypes function), or False if none.
_pause: Any = None
releases = 0  # how many releases were asked and done, a team there or not (tests read it)


def _find_pause() -> Any:
  """torch's `omp_pause_resource_all`, if torch loaded an OpenMP runtime
  that has it (libgomp, or LLVM's libomp / Intel's libiomp5)."""
  for name in ("libgomp.so.1", "libomp.so", "libiomp5.so"):
    try:
      # RTLD_NOLOAD: only a runtime already in the process (torch's).
      library = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
      continue
    pause = getattr(library, "omp_pause_resource_all", None)
    if pause is not None:
      pause.argtypes = [ctypes.c_int]
      pause.restype = ctypes.c_int
      return pause
  return False


def _pause_function() -> Any:
  """omp_pause_resource_all, or False (none, or turned off)."""
  global _pause
  if os.environ.get(ENV, "1") == "0":
    return False
  if _pause is None:
    with _lock:
      if _pause is None:
        _pause = _find_pause() if hasattr(os, "RTLD_NOLOAD") else False
  return _pause


def pause_address() -> int | None:
  """The address of torch's `omp_pause_resource_all` for the native op's
  torch thread, or None (no such runtime, or turned off)."""
  pause = _pause_function()
  return ctypes.cast(pause, ctypes.c_void_p).value if pause else None


def release_this_threads_team() -> bool:
  """Releases the calling thread's OpenMP team; whether one was."""
  global releases
  pause = _pause_function()
  if pause and pause(_OMP_PAUSE_SOFT) == 0:
    releases += 1
    return True
  return False


def release_user_team() -> None:
  """Releases the calling thread's idle OpenMP team (see the module
  docstring); a no-op where turned off or without such a runtime."""
  if torch.get_num_threads() >= 2:
    release_this_threads_team()
