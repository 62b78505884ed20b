"""Keeping the Python thread state of TF's threads between callbacks.

TF runs a `tf.py_function` body on its own threads, which Python did not
create, and takes the GIL there with a PyGILState_Ensure/Release pair: the
pair makes a fresh Python thread state for every call and destroys it after,
which costs each call tens of microseconds and runs the body cold (empty
`threading.local()`s, a new frame stack). One extra, never-released
`PyGILState_Ensure` on such a thread keeps its thread state alive for the
life of the thread; TF's pair then finds it and leaves it. The native op
does the same in C++ (csrc/torchbridge_op.cc, GilLock).

Threads Python made are left alone: Python deletes their thread state
when they end, whatever the count.
"""

import ctypes
import threading

_kept = threading.local()
_DUMMY_THREAD = getattr(threading, "_DummyThread", None)


def keep_for_this_thread() -> None:
  """Keeps the calling thread's Python thread state if Python did not make
  the thread. Needs the GIL (any Python code has it); cheap after the first
  call on a thread.

  Examples:
    >>> keep_for_this_thread()  # a no-op on the main thread
  """
  if getattr(_kept, "done", False):
    return
  _kept.done = True
  if _DUMMY_THREAD is None or not isinstance(threading.current_thread(), _DUMMY_THREAD):
    return
  try:
    ensure = ctypes.pythonapi.PyGILState_Ensure
  except AttributeError:  # not CPython: nothing to keep
    return
  ensure.restype = ctypes.c_int
  ensure()  # never released: the thread state outlives TF's pair
