"""The C++ torch runner's library: csrc/exported/ (its README says which
file does what), built on first use and cached beside the op's, loaded
with ctypes (a `_side_library.SideLibrary`). The programs it runs are
`_exported_program.ExportedProgram`s. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchbridge._crossing import _stats
from torchbridge._native import _build
from torchbridge._native import _compiler
from torchbridge._native import _side_library

# The file with the op's callbacks first: it is the unit compiled, the
# others included before it.
_SOURCES = [
  Path("exported") / name
  for name in ("exported_call.cc", "program.cc", "interpreter.cc", "records.cc")
]
_HEADERS = [
  Path("exported") / "program.h",
  Path("exported") / "records.h",
  Path("adopt_rules.h"),
  Path("native_callback.h"),  # the callbacks' ABI
]


def _torch_flags() -> _side_library.Flags:
  """(compile flags, link flags) for torch's C++ side."""
  flags = _compiler.torch_interop_flags(_build.source_dir())
  if flags is None:
    raise _compiler.BuildError(
      "building the C++ torch runner needs torch's C++ headers and libraries "
      "(torch/include, torch/lib)"
    )
  return flags


def _library_failure(err: Exception) -> str:
  return f"its C++ library could not be built or loaded: {err}"


def _load(path: Path) -> Any:
  """The library at `path`, its functions typed, its copies counted in
  `exchange_stats()`."""
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


_LIBRARY = _side_library.SideLibrary(
  "torchbridge_exported",
  _SOURCES,
  headers=_HEADERS,
  flags=_torch_flags,
  load=_load,
  what="the C++ torch runner",
  # AttributeError: a file without the library's functions.
  errors=(_compiler.BuildError, OSError, AttributeError),
  describe=_library_failure,
)


def library() -> Any:
  """The loaded library (ctypes), building it on first use.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  return _LIBRARY.library()


def unavailable() -> str | None:
  """Why the library cannot be had (built or loaded), or None once it is
  loaded; tried once per process."""
  return _LIBRARY.unavailable()


def loaded_from() -> Path | None:
  """The file the library was loaded from; None before it is."""
  return _LIBRARY.loaded_from


def library_path() -> Path:
  """Where this set-up's library is (or would be) cached; no build.

  Raises:
    BuildError: torch's C++ headers are missing.
  """
  return _LIBRARY.path()


def build_or_reuse(force: bool = False) -> Path:
  """The library's path, built if not cached (or with `force`); what
  `python -m torchbridge build` runs ahead of first use.

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  return _LIBRARY.build_or_reuse(force)


def build_torch_library(
  source: Path, stem: str, headers: Sequence[Path] = (), force: bool = False
) -> Path:
  """`source` compiled against torch's C++ headers and libraries (none of
  TF's) into a shared library cached beside the op's, keyed by the set-up,
  the flags, `source` and the `headers` it includes; built once per key
  (said through the "torchbridge" logger), or again with `force`. For the
  benchmarks' C++ callbacks (benchmarks/scripted_native.py).

  Raises:
    BuildError: torch's C++ headers are missing, or the build failed (the
      message names the log).
  """
  side = _side_library.SideLibrary(
    stem, [source], headers=headers, flags=_torch_flags, load=lambda path: ctypes.CDLL(str(path))
  )
  return side.build_or_reuse(force)


def address(function: Any) -> int:
  """A ctypes function's address."""
  return int(ctypes.cast(function, ctypes.c_void_p).value or 0)
