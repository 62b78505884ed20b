"""The native TF op `TorchbridgeCall`: loading it, once, on first use.

Inside `tf.function`, `TorchbridgeCall` (csrc/) calls a Python callable with
its inputs and adopts what it returns as outputs, without copies: torch
tensors made in C++ (`torch_tensors=True`, what the bridge uses), or DLPack
capsules both ways. It replaces `tf.py_function` (no EagerTensor wrapping,
static output shapes, TF's CUDA stream handed to torch on GPUs).

`load()` builds the library on first use (`_build`), loads it, and
hands it the three Python functions it calls (`_callbacks.dispatch`, `_callbacks.registry`,
`_adopt.export_output`), once, as TF's own py_func registers its trampoline.
Nothing happens at import. When the op cannot be had
(`TORCHBRIDGE_DISABLE_NATIVE=1`, no compiler, a failed build or load), one
line is logged to the "torchbridge" logger and `available()` is False;
callers then use the `tf.py_function` path.

Its callbacks are in `_callbacks`; `_op.call` emits it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._crossing import _adopt
from torchbridge._native import _callbacks
from torchbridge._runtime import _timeline

_LOG = logging.getLogger("torchbridge")

DISABLE_ENV = "TORCHBRIDGE_DISABLE_NATIVE"

_load_lock = threading.Lock()
_library: Any = None  # the loaded op module, once loaded
_tried = False  # whether load() has run (successfully or not)
_status = "not loaded"  # one line: what load() did
_interop = False  # whether the loaded library has csrc/torch_interop.cc
_library_path: Path | None = None  # the file it was loaded from


# ---------------------------------------------------------------------------
# Loading


def load() -> Any:
  """Returns the loaded op library, building it on first use; None if not.

  Never raises: when the op cannot be had, logs one line to the
  "torchbridge" logger (info when disabled by `TORCHBRIDGE_DISABLE_NATIVE`,
  warning otherwise) and returns None, in this call and every later one.
  Thread-safe; the build also holds a file lock, so concurrent processes
  build once.
  """
  global _library, _tried, _status, _interop, _library_path
  if _tried:
    return _library
  with _load_lock:
    if _tried:
      return _library
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
      _status = (
        f"torchbridge: native TF op disabled by {DISABLE_ENV}="
        f"{os.environ[DISABLE_ENV]}; using the tf.py_function path"
      )
      _LOG.info(_status)
    else:
      # Imported here, when the op is first needed: the build's tools
      # (compiler flags, subprocesses, the cache) cost `import torchbridge`
      # nothing.
      from torchbridge._native import _build  # pylint: disable=import-outside-toplevel

      try:
        path = _build.build_or_reuse()
        _library = tf.load_op_library(str(path))
        _interop = _build.connect(
          path,
          dispatch=_callbacks.dispatch,
          registry=_callbacks.registry,
          export_output=_adopt.export_output,
        )
        # The op has no gradient of its own: callers wrap it in
        # tf.custom_gradient. Declared non-differentiable, a tape around a
        # tf.function that holds it gives None gradients instead of failing
        # the call with a LookupError.
        tf.no_gradient("TorchbridgeCall")
        _connect_native(path)
        _timeline.connect(path)
        _library_path = path
        if _interop:
          _status = (
            f"torchbridge: native TF op loaded from {path} (complete: torch tensors made in C++)"
          )
        else:
          reason = _build.build_record(path).get("reason") or (
            "built without its torch side (torch_interop.cc)"
          )
          _status = (
            f"torchbridge: native TF op loaded from {path} without "
            f"its torch side, trading DLPack capsules with Python "
            f"(slower per call): {reason}. After fixing that, "
            "rebuild with `python -m torchbridge build --force`"
          )
          _LOG.warning(_status)
      except Exception as err:  # pylint: disable=broad-except
        _library = None
        _status = (
          f"torchbridge: native TF op unavailable ({_one_line(err)})"
          f"; using the tf.py_function path (set {DISABLE_ENV}=1 to "
          "skip the attempt)"
        )
        _LOG.warning(_status)
    _tried = True
    return _library


def _connect_native(path: Path) -> None:
  """Hands `_callbacks` the library's registry of C++ callbacks."""
  set_native = ctypes.CDLL(str(path)).torchbridge_set_native_callback
  set_native.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
  set_native.restype = None
  _callbacks.connect_native(set_native)


def has_torch_interop() -> bool:
  """Whether the loaded op hands torch tensors over itself (C++)."""
  return load() is not None and _interop


def native_available() -> bool:
  """Whether bridged graph calls use torchbridge's native TF op.

  Inside `tf.function`, a call that runs torch goes through a custom TF op
  (`TorchbridgeCall`, built from the package's C++ sources) when it is available, and through
  `tf.py_function` otherwise: both give the same results, the native op
  at a lower cost per call. The first call builds the op (or reuses the
  cached build; `python -m torchbridge build` builds it ahead of time) and
  loads it; when that fails, one line saying why goes to the "torchbridge"
  logger and the answer is False. `TORCHBRIDGE_DISABLE_NATIVE=1` turns the
  op off; `python -m torchbridge info` reports its state.

  Returns:
    True when the native op is loaded and in use, False when calls take the
      `tf.py_function` path.

  Examples:
    >>> import torch, torchbridge as tb
    >>> isinstance(tb.native_available(), bool)
    True
  """
  return not getattr(_python_path, "forced", False) and load() is not None


# The name torchbridge's own modules use.
available = native_available


_python_path = threading.local()


@contextlib.contextmanager
def python_path() -> Iterator[None]:
  """Within it, calls traced on this thread use the tf.py_function path.

  For side-by-side measurements (the benchmarks); users choose the path for
  a whole process with the environment variable.
  """
  outer = getattr(_python_path, "forced", False)
  _python_path.forced = True
  try:
    yield
  finally:
    _python_path.forced = outer


def status() -> str:
  """One line saying what `load()` did (or "not loaded")."""
  return _status


def loaded_from() -> Path | None:
  """The file the op was loaded from, or None (not loaded, or not had)."""
  return _library_path


def _one_line(err: BaseException) -> str:
  text = " ".join(str(err).split())
  return text if len(text) <= 400 else text[:397] + "..."
