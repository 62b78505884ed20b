"""The C++ call path of `TorchModule(..., torchscript=True)`: its library
(csrc/traced/traced_call.cc, built on first use and cached beside the op's)
and the traced modules it runs.

A `TracedModule` is a TorchScript module loaded into that library, with
the two C++ callbacks (`_callbacks.NativeCallback`) that the native op's CPU
kernel runs for its forward and backward ops, with no GIL and no Python per
call. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (before tensorflow)

from torchbridge._crossing import _stats
from torchbridge._native import _build
from torchbridge._native import _callbacks
from torchbridge._native import _compiler

_SOURCE = Path("traced") / "traced_call.cc"
_STEM = "torchbridge_traced"
_lock = threading.Lock()
_library: Any = None


def library() -> Any:
  """The loaded library (ctypes), building it on first use.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  global _library
  if _library is not None:
    return _library
  with _lock:
    if _library is None:
      _library = _load(_build_or_reuse())
  return _library


def _build_or_reuse() -> Path:
  sources = _build.source_dir()
  return build_torch_library(sources / _SOURCE, _STEM, [sources / "native_callback.h"])


def build_torch_library(source: Path, stem: str, headers: Sequence[Path] = ()) -> Path:
  """`source` compiled against torch's C++ headers and libraries (none of
  TF's) into a shared library cached beside the op's, keyed by the set-up,
  the flags, `source` and the `headers` it includes; built once per key
  (said through the "torchbridge" logger).

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  sources = _build.source_dir()
  flags = _compiler.torch_interop_flags(sources)
  if flags is None or not source.is_file():
    raise _compiler.BuildError(
      f"building {source.name} needs torch's C++ headers and libraries "
      f"(torch/include, torch/lib) and {source}"
    )
  compile_flags, link_flags = flags
  digest = hashlib.sha256()
  for part in (_build._versions(), " ".join(compile_flags + link_flags)):
    digest.update(part.encode() + b"\0")
  for path in (source, *headers):
    digest.update(path.read_bytes())
  target = _build.cache_dir() / f"{stem}-{digest.hexdigest()[:20]}.so"

  def build(compiler: str, target: Path) -> None:
    _build._say(
      logging.INFO,
      "torchbridge: building %s into %s, once per set-up (10-30 s on 2 cores)",
      source.name,
      target.parent,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{stem}-") as work:
      output = Path(work, target.name)
      common = [compiler, "-fPIC", "-O2", "-I" + str(sources), *compile_flags]
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

  return _build.build_once(target, build)


def _load(path: Path) -> Any:
  lib = ctypes.CDLL(str(path))
  lib.tbt_load.restype = ctypes.c_void_p
  lib.tbt_load.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
  lib.tbt_records.restype = ctypes.c_int64
  lib.tbt_records.argtypes = [ctypes.c_void_p, ctypes.c_int]
  lib.tbt_copies.restype = None
  lib.tbt_copies.argtypes = [ctypes.POINTER(ctypes.c_int64)]

  def copies() -> tuple[int, int, int]:
    counts = (ctypes.c_int64 * 2)()
    lib.tbt_copies(counts)
    # The op counted each result it adopted as a zero-copy crossing; a copied
    # one is a copy, counted once.
    return -counts[0], counts[0], counts[1]

  _stats.add_source(copies)
  return lib


class TracedModule:
  """A TorchScript module run by the native op's kernel, from C++.

  `forward` and `backward` are the callbacks of its two ops: the forward
  op takes the module's arguments and returns a one-byte handle and the
  outputs (with no record made when nothing consumes the handle); the
  backward op takes the handle and one gradient per output and returns one
  gradient per argument (those the graph consumes).
  """

  def __init__(self, script_module: torch.jit.ScriptModule, num_threads: int) -> None:
    lib = library()
    with tempfile.TemporaryDirectory(prefix="torchbridge_traced_") as tmp:
      path = os.path.join(tmp, "module.pt")
      script_module.save(path)
      error = ctypes.create_string_buffer(1024)
      context = lib.tbt_load(path.encode(), num_threads, error, len(error))
    if not context:
      raise RuntimeError(f"loading the traced module into C++ failed: {error.value.decode()}")
    self._context = context
    self.forward = _callbacks.NativeCallback(_address(lib.tbt_forward), context, owner=self)
    self.backward = _callbacks.NativeCallback(_address(lib.tbt_backward), context, owner=self)

  def records(self, made: bool = False) -> int:
    """Forward records alive (each freed with its handle), or made so far."""
    return int(library().tbt_records(self._context, int(made)))


def _address(function: Any) -> int:
  """A ctypes function's address."""
  return int(ctypes.cast(function, ctypes.c_void_p).value or 0)
