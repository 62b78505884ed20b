"""One thread runs the torch work of bridged calls inside TF graphs.

torch's intra-op parallelism (OpenMP in the CPU wheels) keeps a team of
worker threads per thread that starts a parallel region, alive as long as
that thread. TF runs bridged ops on whichever of its inter-op threads is
free; when the torch code ran there, every such thread grew a team; with more
OpenMP threads than cores, libgomp's idle workers stop spinning and every
parallel region in the process, the user's own torch code included, pays a
wake-up (measured: a pure-torch matmul loop 490 us alone, 800 us beside one
more team). Here every bridged forward and backward inside a graph runs on
one thread: one team, however many threads TF has. The native op's CPU
kernel hands its calls to a thread of its own, in C++, without the GIL
(csrc/torch_thread.h, the same rules); this module's thread serves the
`tf.py_function` path, and `apply_threads` gives the native one the user's
thread count. Eager calls run on the
calling thread, the user's own (a hand-over costs more than an eager call;
see docs/guides/threads.md, "One torch thread"). `TORCHBRIDGE_TORCH_THREAD=0` runs
graph calls where TF calls them too, as before: the lowest latency per
call, and a team per TF thread.

The thread ends after `IDLE_SECONDS` without work; libgomp parks its team,
asleep, so torch code the user runs later on their own thread has the cores
to itself; the next bridged call starts a new thread (~0.1 ms).

What crosses to the torch thread with each call: the function and its
arguments, and torch's intra-op thread count on the user's thread
(`torch.set_num_threads` is per thread under OpenMP: a TF thread that ran
torch code before the user's setting keeps the count it had).
`remember_threads()`, called by the bridge on the thread that makes an
eager call or traces a `tf.function`, records it. Grad mode is set by the
bridge inside the function. Other thread-local torch state of the tracing
thread (autocast, `torch.set_default_device`) does not reach graph calls
(it did not on TF's threads either).

Calls from the torch thread itself run inline. A call that finds the thread
busy for longer than `WAIT_SECONDS` runs on its own thread instead, so a
bridged call nested inside another one's torch code (which would wait for
the busy thread forever) still completes.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from torchbridge._runtime import _omp_team

IDLE_SECONDS = 0.2
# Without work this long, the thread releases its OpenMP team (_omp_team).
TEAM_IDLE_SECONDS = 0.005
WAIT_SECONDS = 2.0
ENABLED = os.environ.get("TORCHBRIDGE_TORCH_THREAD", "1") != "0"
# How the native op's hand-off waits (csrc/torch_thread.h): "adaptive" (the
# default) spins briefly unless a yield found the core contended in the last
# second; "always" spins regardless; "never" sleeps at once. Read by the C++
# thread when it is made; reported here.
SPIN_ENV = "TORCHBRIDGE_TORCH_THREAD_SPIN"
SPINS = ("adaptive", "always", "never")

T = TypeVar("T")


class _Task:
  __slots__ = ("fn", "args", "threads", "done", "result", "error", "taken")

  def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], threads: int) -> None:
    # The function and its arguments: None once run (nothing kept alive).
    self.fn: Any = fn
    self.args: Any = args
    self.threads = threads
    self.done = threading.Lock()
    self.done.acquire()  # released by the torch thread when finished
    self.result: Any = None
    self.error: BaseException | None = None
    self.taken = False


class TorchThread:
  """A thread that runs functions handed to it, one at a time.

  Examples:
    >>> worker = TorchThread()
    >>> worker.run(lambda a, b: a + b, 1, 2, threads=1)
    3
  """

  def __init__(
    self, idle_seconds: float = IDLE_SECONDS, wait_seconds: float = WAIT_SECONDS
  ) -> None:
    self._idle_seconds = idle_seconds
    self._wait_seconds = wait_seconds
    self._reset()
    self.started = 0  # how many threads were started (tests read it)
    self.inline_fallbacks = 0
    self.threads = torch.get_num_threads()  # see remember_threads

  def _reset(self) -> None:
    """No thread, nothing queued: at creation, and in a forked child (which
    inherits this object but not the thread, and maybe a held lock)."""
    self._lock = threading.Lock()
    self._wakeup = threading.Condition(self._lock)
    self._queue: collections.deque[_Task] = collections.deque()
    self._thread: threading.Thread | None = None  # the live torch thread, or None
    self._ident: int | None = None

  def remember_threads(self) -> None:
    """Records the calling thread's torch thread count for later calls."""
    self.threads = torch.get_num_threads()

  def is_current(self) -> bool:
    """Whether the calling thread is this torch thread."""
    return threading.get_ident() == self._ident

  def run(self, fn: Callable[..., T], *args: Any, threads: int | None = None) -> T:
    """Returns `fn(*args)`, computed on the torch thread.

    Args:
      fn: the function; its exceptions are re-raised here.
      *args: its arguments.
      threads: torch's intra-op thread count to run it with (default: the
        last one `remember_threads` recorded).
    """
    if self.is_current():
      return fn(*args)  # already on the torch thread
    if threads is None:
      threads = self.threads
    task = _Task(fn, args, threads)
    with self._lock:
      self._queue.append(task)
      if self._thread is None:
        started = self._start()
      else:
        self._wakeup.notify()
        started = True
      if not started:  # no thread to be had (e.g. at interpreter exit)
        self._queue.remove(task)
    if not started:
      return keeping_subnormals(fn, *args)
    if not task.done.acquire(timeout=self._wait_seconds):
      # Decided under the lock, run outside it: the function may itself
      # make bridged calls (the case this fallback exists for).
      with self._lock:
        fallback = not task.taken
        if fallback:  # still queued: run it here instead
          self._queue.remove(task)
          task.taken = True
          self.inline_fallbacks += 1
      if fallback:
        return keeping_subnormals(fn, *args)
      task.done.acquire()
    # Take the result out of the task: nothing else may keep it alive (a
    # torch view of a variable's buffer held anywhere makes TF copy the
    # buffer on its next in-place update).
    result, task.result = task.result, None
    error, task.error = task.error, None
    if error is None:
      return result
    try:
      raise error
    finally:
      # The traceback holds this frame: without this, the frame and the
      # exception would form a cycle keeping the torch code's frames (and
      # their torch views of TF buffers) alive until the cyclic GC runs.
      del error

  def _start(self) -> bool:  # with self._lock held; whether a thread started
    thread = threading.Thread(target=self._loop, name="torchbridge-torch", daemon=True)
    try:
      thread.start()
    except RuntimeError:  # "can't start new thread" (limits, shutdown)
      return False
    self._thread = thread
    self.started += 1
    return True

  def _loop(self) -> None:
    self._ident = threading.get_ident()
    # Started from one of TF's threads, which flush subnormal floats to
    # zero, this thread inherits the flag: torch's default (kept) instead.
    torch.set_flush_denormal(False)
    my_threads: int | None = None
    team = False  # a call ran since the team was last released
    while True:
      if team:
        with self._lock:
          if not self._queue:
            self._wakeup.wait(TEAM_IDLE_SECONDS)
          team = bool(self._queue)
        if not team:  # idle for a moment: release the OpenMP team
          _omp_team.release_this_threads_team()
      with self._lock:
        if not self._queue:
          self._wakeup.wait(self._idle_seconds)
          if not self._queue:
            # Idle: end the thread (libgomp parks its OpenMP team).
            self._thread = None
            self._ident = None
            return
        task = self._queue.popleft()
        task.taken = True
      team = True
      try:
        if task.threads != my_threads:
          torch.set_num_threads(task.threads)
          my_threads = task.threads
        task.result = task.fn(*task.args)
      except BaseException as error:  # pylint: disable=broad-except
        task.error = error
        del error
      task.fn = task.args = None
      task.done.release()
      del task  # hold nothing of it while waiting for the next one

  def alive(self) -> bool:
    """Whether a torch thread is running now."""
    return self._thread is not None


_THE_THREAD = TorchThread()
if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_THE_THREAD._reset)  # pylint: disable=protected-access


def run(fn: Callable[..., T], *args: Any, threads: int | None = None) -> T:
  """`fn(*args)` on the process's torch thread; see `TorchThread.run`.

  Here, on the calling thread, with `TORCHBRIDGE_TORCH_THREAD=0`.
  """
  if not ENABLED:
    return keeping_subnormals(fn, *args)
  return _THE_THREAD.run(fn, *args, threads=threads)


_SUBNORMAL = np.array([5e-324])  # the smallest float64 above zero


def keeping_subnormals(fn: Callable[..., T], *args: Any) -> T:
  """`fn(*args)` with subnormal floats kept, torch's default, on a thread
  that flushes them to zero (TF's threads do); its flag is restored after."""
  flushing = float(_SUBNORMAL[0] * 1.0) == 0.0  # FTZ/DAZ set here
  if not flushing:
    return fn(*args)
  torch.set_flush_denormal(False)
  try:
    return fn(*args)
  finally:
    torch.set_flush_denormal(True)


_applied = threading.local()


def apply_threads() -> None:
  """Gives the calling thread the user's torch intra-op thread count.

  For the native op's torch thread (csrc/torch_thread.h), which runs
  Python callbacks but is not a `TorchThread`; a no-op where the count is
  already set, and with `TORCHBRIDGE_TORCH_THREAD=0` (calls then run on
  TF's threads, with whatever count those have, as before).
  """
  if not ENABLED:
    return
  wanted = _THE_THREAD.threads
  if getattr(_applied, "threads", None) != wanted:
    torch.set_num_threads(wanted)
    _applied.threads = wanted


def spin_setting() -> str:
  """The native op's hand-off spin setting, as `python -m torchbridge info`
  reports it (an unknown value is the default, said so)."""
  value = os.environ.get(SPIN_ENV, "adaptive")
  if value in SPINS:
    return value
  return f"adaptive ({SPIN_ENV}={value!r} is not one of {', '.join(SPINS)}: ignored)"


def remember_threads() -> None:
  """Records the calling (user's) thread's torch intra-op thread count."""
  _THE_THREAD.remember_threads()


def on_torch_thread() -> bool:
  """Whether the calling thread is the `TorchThread` (the `tf.py_function`
  path's graph calls run there)."""
  return _THE_THREAD.is_current()


def torch_thread() -> TorchThread:
  """The process's `TorchThread` (tests and benchmarks read its counters)."""
  return _THE_THREAD
