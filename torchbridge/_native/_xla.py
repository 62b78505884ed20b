"""TorchbridgeCall under XLA: csrc/xla/xla_call.cc, a library of its own.

It registers an XLA kernel of the op (an `xla::CustomCall` with the typed
FFI) and the custom call's host handler, which runs the same callback as the
CPU kernel through the op library's `torchbridge_host_call`. An op traced
with unknown dimensions gets its output shapes when XLA compiles it for
concrete input shapes, through the op library's
`torchbridge_host_output_shapes`, which calls `_callbacks.output_shapes`
(the function registered beside the op's callback). It is built on
first use, when a bridged call is traced inside `tf.function(jit_compile=True)`
(or by `python -m torchbridge build`), cached beside the op's library and
loaded after it with `tf.load_op_library`: programs that never compile with
XLA never pay its build. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._crossing import _stats
from torchbridge._native import _build
from torchbridge._native import _callbacks
from torchbridge._native import _compiler
from torchbridge._native import _loader

_SOURCE = Path("xla") / "xla_call.cc"
_STEM = "torchbridge_xla"
_lock = threading.Lock()
_library: Any = None  # ctypes handle, once loaded
_loaded_from: Path | None = None
_failure: str | None = None  # why it cannot be had, once tried


def _flags() -> tuple[list[str], list[str]]:
  """(compile flags, link flags): TF's, plus the two include directories
  tf.sysconfig leaves out and the library that holds XLA's symbols."""
  include = Path(tf.sysconfig.get_include())
  lib_dir = Path(tf.sysconfig.get_lib())
  compile_flags = [
    "-std=c++17",
    *tf.sysconfig.get_compile_flags(),
    "-I" + str(include / "external" / "highwayhash"),
    "-I" + str(include / "external" / "farmhash_archive" / "src"),
  ]
  link_flags = [
    *tf.sysconfig.get_link_flags(),
    "-l:libtensorflow_cc.so.2",
    "-Wl,-rpath," + str(lib_dir),
  ]
  return compile_flags, link_flags


def library_path() -> Path:
  """Where this set-up's library is (or would be) cached; no build."""
  source = _build.source_dir() / _SOURCE
  compile_flags, link_flags = _flags()
  digest = hashlib.sha256()
  for part in (_build._versions(), " ".join(compile_flags + link_flags)):
    digest.update(part.encode() + b"\0")
  digest.update(source.read_bytes())
  return _build.cache_dir() / f"{_STEM}-{digest.hexdigest()[:20]}.so"


def build_or_reuse(force: bool = False) -> Path:
  """The library's path, built if not cached (or with `force`).

  Raises:
    BuildError: no compiler, or the build failed (the message names the log).
  """
  source = _build.source_dir() / _SOURCE
  if not source.is_file():
    raise _compiler.BuildError(f"{source} not found")
  compile_flags, link_flags = _flags()

  def build(compiler: str, target: Path) -> None:
    _build._say(
      logging.INFO,
      "torchbridge: building the XLA custom call (%s, for jit_compile=True) "
      "into %s, once per set-up (about 25 s on 2 cores)",
      source.name,
      target.parent,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{_STEM}-") as work:
      output = Path(work, target.name)
      common = [compiler, "-fPIC", "-O1", "-I" + str(_build.source_dir()), *compile_flags]
      plan = _compiler.Plan(
        files={},
        compiles=[common + ["-c", str(source), "-o", f"{output}.o"]],
        link=[compiler, "-shared", "-o", str(output), f"{output}.o", *link_flags],
      )
      failure = _compiler.run(plan, target.with_suffix(".log"))
      if failure:
        raise _compiler.BuildError(failure.replace("the native op (csrc/)", source.name))
      os.chmod(output, 0o755)
      os.replace(output, target)
    _build._say(
      logging.INFO,
      "torchbridge: built %s in %.1f s: %s",
      source.name,
      time.monotonic() - started,
      target,
    )

  return _build.build_once(library_path(), build, force)


def load() -> Any:
  """The loaded library (ctypes), building it on first use; needs the op's.

  Raises:
    BuildError, OSError, RuntimeError: it cannot be had (the message says why).
  """
  global _library, _loaded_from
  if _library is not None:
    return _library
  with _lock:
    if _library is None:
      if _loader.load() is None or _loader.loaded_from() is None:
        raise RuntimeError(f"the native op is not loaded ({_loader.status()})")
      if not _loader.has_torch_interop():
        raise RuntimeError("the native op was built without its torch side (torch_interop.cc)")
      path = build_or_reuse()
      tf.load_op_library(str(path))  # registers the XLA kernel and the handler
      lib = ctypes.CDLL(str(path))
      op = ctypes.CDLL(str(_loader.loaded_from()))
      lib.torchbridge_xla_set_host_call.argtypes = [ctypes.c_void_p]
      lib.torchbridge_xla_set_host_call(ctypes.cast(op.torchbridge_host_call, ctypes.c_void_p))
      # Output shapes at XLA's compile time: Python's, through the op library.
      set_hook = ctypes.PyDLL(str(_loader.loaded_from())).torchbridge_set_output_shapes_hook
      set_hook.argtypes, set_hook.restype = [ctypes.py_object], ctypes.c_int
      set_hook(_callbacks.output_shapes)
      lib.torchbridge_xla_set_output_shapes.argtypes = [ctypes.c_void_p]
      lib.torchbridge_xla_set_output_shapes(
        ctypes.cast(op.torchbridge_host_output_shapes, ctypes.c_void_p)
      )
      lib.torchbridge_xla_calls.restype = ctypes.c_int64
      copies = op.torchbridge_host_copies
      copies.argtypes = [ctypes.POINTER(ctypes.c_int64)]

      def counts() -> tuple[int, int, int]:
        out = (ctypes.c_int64 * 2)()
        copies(out)
        return 0, out[0], out[1]

      _stats.add_source(counts)
      _library, _loaded_from = lib, path
  return _library


def unavailable() -> str | None:
  """Why bridged calls cannot run under XLA, or None once they can; tried
  once per process."""
  global _failure
  if _library is None and _failure is None:
    try:
      load()
    except Exception as err:  # pylint: disable=broad-except
      _failure = " ".join(str(err).split())[:600]
  return _failure


def available() -> bool:
  return unavailable() is None


def jit_usable() -> bool:
  """Whether a module with `run="torch"` may compile with XLA here (a Keras
  layer's `supports_jit`): TF sees no GPU (the custom call has no GPU
  lowering) and the library loads, which builds it on first use."""
  return not tf.config.list_physical_devices("GPU") and available()


def loaded_from() -> Path | None:
  return _loaded_from


def calls() -> int:
  """Host calls XLA made so far (0 before the library is loaded)."""
  return int(_library.torchbridge_xla_calls()) if _library is not None else 0
