"""The C++ torch runner's library: csrc/exported/exported_call.cc, built on
first use and cached beside the op's, loaded with ctypes. The programs it
runs are `_exported_program.ExportedProgram`s. Nothing here runs at
import.
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


from torchbridge._crossing import _stats
from torchbridge._native import _build
from torchbridge._native import _compiler

_SOURCE = Path("exported") / "exported_call.cc"
_STEM = "torchbridge_exported"
_lock = threading.Lock()
_library: Any = None
_loaded_from: Path | None = None
_failure: str | None = None  # why the library cannot be built or loaded


def library() -> Any:
  """The loaded library (ctypes), building it on first use.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  global _library, _loaded_from
  if _library is not None:
    return _library
  with _lock:
    if _library is None:
      path = build_or_reuse()
      _library, _loaded_from = _load(path), path
  return _library


def unavailable() -> str | None:
  """Why the library cannot be had (built or loaded), or None once it is
  loaded; tried once per process."""
  global _failure
  if _library is None and _failure is None:
    try:
      library()
    # AttributeError: a file without the library's functions.
    except (_compiler.BuildError, OSError, AttributeError) as err:
      _failure = f"its C++ library could not be built or loaded: {err}"
  return _failure


def loaded_from() -> Path | None:
  """The file the library was loaded from; None before it is."""
  return _loaded_from


def library_path() -> Path:
  """Where this set-up's library is (or would be) cached; no build.

  Raises:
    BuildError: torch's C++ headers are missing.
  """
  source, stem, headers = _own_parts()
  return _target(source, stem, headers, _torch_flags(source))


def build_or_reuse(force: bool = False) -> Path:
  """The library's path, built if not cached (or with `force`); what
  `python -m torchbridge build` runs ahead of first use.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  source, stem, headers = _own_parts()
  return build_torch_library(source, stem, headers, force)


def _own_parts() -> tuple[Path, str, list[Path]]:
  """This library's source, file stem and the headers it includes."""
  sources = _build.source_dir()
  return sources / _SOURCE, _STEM, [sources / "native_callback.h"]


def _torch_flags(source: Path) -> tuple[list[str], list[str]]:
  """(compile flags, link flags) for torch's C++ side."""
  flags = _compiler.torch_interop_flags(_build.source_dir())
  if flags is None or not source.is_file():
    raise _compiler.BuildError(
      f"building {source.name} needs torch's C++ headers and libraries "
      f"(torch/include, torch/lib) and {source}"
    )
  return flags


def _target(
  source: Path, stem: str, headers: Sequence[Path], flags: tuple[list[str], list[str]]
) -> Path:
  """The cached library's path, keyed by the set-up, `flags`, `source` and
  `headers`."""
  digest = hashlib.sha256()
  for part in (_build._versions(), " ".join(flags[0] + flags[1])):
    digest.update(part.encode() + b"\0")
  for path in (source, *headers):
    digest.update(path.read_bytes())
  return _build.cache_dir() / f"{stem}-{digest.hexdigest()[:20]}.so"


def build_torch_library(
  source: Path, stem: str, headers: Sequence[Path] = (), force: bool = False
) -> Path:
  """`source` compiled against torch's C++ headers and libraries (none of
  TF's) into a shared library cached beside the op's, keyed by the set-up,
  the flags, `source` and the `headers` it includes; built once per key
  (said through the "torchbridge" logger), or again with `force`.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  compile_flags, link_flags = flags = _torch_flags(source)
  target = _target(source, stem, headers, flags)
  sources = _build.source_dir()

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

  return _build.build_once(target, build, force)


def _load(path: Path) -> Any:
  lib = ctypes.CDLL(str(path))
  i64, p, s = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
  signatures = {
    "tbe_new": (p, [i64, i64]),
    "tbe_op": (i64, [p, s, s, i64, s, i64]),
    "tbe_getitem": (i64, [p, i64]),
    "tbe_arith": (i64, [p, i64]),
    "tbe_arg": (None, [p, i64]),
    "tbe_value_slot": (None, [p, i64]),
    "tbe_value_none": (None, [p]),
    "tbe_value_wrapped_slot": (None, [p, i64]),
    "tbe_value_wrapped": (None, [p, i64, ctypes.c_double]),
    "tbe_value_int": (None, [p, i64]),
    "tbe_value_double": (None, [p, ctypes.c_double]),
    "tbe_value_bool": (None, [p, ctypes.c_int]),
    "tbe_value_str": (None, [p, s]),
    "tbe_value_device": (ctypes.c_int, [p, s, s, i64]),
    "tbe_finish": (ctypes.c_int, [p, ctypes.POINTER(i64), i64, i64, ctypes.c_char_p, s, i64]),
    "tbe_records": (i64, [p, ctypes.c_int]),
    "tbe_copies": (None, [ctypes.POINTER(i64)]),
    "tbe_xla_op_new": (p, [p, ctypes.c_int]),
    "tbe_xla_op_set_backwards": (None, [p, i64]),
  }
  for name, (restype, argtypes) in signatures.items():
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, argtypes

  def copies() -> tuple[int, int, int]:
    counts = (ctypes.c_int64 * 2)()
    lib.tbe_copies(counts)
    # The op counted each result it adopted as a zero-copy crossing; a copied
    # one is a copy, counted once.
    return -counts[0], counts[0], counts[1]

  _stats.add_source(copies)
  return lib


def address(function: Any) -> int:
  """A ctypes function's address."""
  return int(ctypes.cast(function, ctypes.c_void_p).value or 0)
