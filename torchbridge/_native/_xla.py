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
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._crossing import _stats
from torchbridge._native import _callbacks
from torchbridge._native import _loader
from torchbridge._native import _side_library


def _flags() -> _side_library.Flags:
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


def _require_the_op() -> None:
  """Raises RuntimeError unless the op's library is loaded with its torch
  side: the custom call runs the op's host call."""
  if _loader.load() is None or _loader.loaded_from() is None:
    raise RuntimeError(f"the native op is not loaded ({_loader.status()})")
  if not _loader.has_torch_interop():
    raise RuntimeError("the native op was built without its torch side (torch_interop.cc)")


def _load(path: Path) -> Any:
  """The library at `path`, registered with TF and hooked to the op's."""
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
  return lib


_LIBRARY = _side_library.SideLibrary(
  "torchbridge_xla",
  [Path("xla") / "xla_call.cc"],
  flags=_flags,
  load=_load,
  requires=_require_the_op,
  what="the XLA custom call (for jit_compile=True)",
  optimize="-O1",
  takes="about 40 s on 2 cores",
)


def library_path() -> Path:
  """Where this set-up's library is (or would be) cached; no build."""
  return _LIBRARY.path()


def build_or_reuse(force: bool = False) -> Path:
  """The library's path, built if not cached (or with `force`).

  Raises:
    BuildError: no compiler, or the build failed (the message names the log).
  """
  return _LIBRARY.build_or_reuse(force)


def load() -> Any:
  """The loaded library (ctypes), building it on first use; needs the op's.

  Raises:
    BuildError, OSError, RuntimeError: it cannot be had (the message says why).
  """
  return _LIBRARY.library()


def unavailable() -> str | None:
  """Why bridged calls cannot run under XLA, or None once they can; tried
  once per process."""
  return _LIBRARY.unavailable()


def available() -> bool:
  return unavailable() is None


def jit_usable() -> bool:
  """Whether a module with `run="torch"` may compile with XLA here (a Keras
  layer's `supports_jit`): TF sees no GPU (the custom call has no GPU
  lowering) and the library loads, which builds it on first use."""
  return not tf.config.list_physical_devices("GPU") and available()


def loaded_from() -> Path | None:
  return _LIBRARY.loaded_from


def calls() -> int:
  """Host calls XLA made so far (0 before the library is loaded)."""
  lib = _LIBRARY.loaded
  return int(lib.torchbridge_xla_calls()) if lib is not None else 0
