"""Native libraries torch loads lazily, made safe to load after TensorFlow.

The clash (measured on TF 2.21 with triton 3.8, the triton that every Linux
x86_64 torch wheel from PyPI depends on): TensorFlow >= 2.20 loads
`_pywrap_tensorflow_internal.so` with `RTLD_GLOBAL`, which puts it and its
dependencies in the process's global symbol scope; one of them,
`libtensorflow_framework.so.2`, exports about 10,000 LLVM symbols.
`triton/_C/libtriton.so` carries its own, different LLVM and exports the same
names (about 17,000 symbols in common). Loaded after TensorFlow with the
default flags, the dynamic linker binds libtriton's references to the first
definition in the global scope, TF's, so libtriton's static initializers run
its LLVM code on TF's LLVM objects and the process dies with SIGSEGV
(`llvm::DebugCounter` registration in `PassBuilder.cpp`). Loaded before
TensorFlow it binds to itself: `import triton; import tensorflow` works,
`import tensorflow; import triton` crashes. torch imports triton lazily
(`torch._dynamo` -> `torch.utils._triton.has_triton_package`), the first time
many ordinary functions run, and inside a bridged call TF is always loaded.

The fix: before anything imports triton, `load_before_tensorflow` loads
libtriton: plainly when TensorFlow is not loaded yet (it then binds to
itself), and with `RTLD_DEEPBIND` when it is, which makes the library
resolve its own symbols before the global scope. When Python
later imports `triton._C.libtriton`, `dlopen` finds the same file already
loaded and returns it as it is. Nothing of triton's Python code runs here.

Where this cannot be done (no `RTLD_DEEPBIND`, as on musl) and TensorFlow is
already loaded, importing torchbridge raises `ImportError` naming the order
that works instead of leaving a crash for later.
"""

import ctypes
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path

_LOG = logging.getLogger("torchbridge")

# Set to "0" to skip the preload (e.g. to rule it out while debugging).
PRELOAD_ENV = "TORCHBRIDGE_PRELOAD_TRITON"

ORDER_MESSAGE = """\
torchbridge cannot make triton safe to load in this process: TensorFlow is
already imported, triton ({path}) is installed and not loaded yet, and
{reason}. Loading triton's native library after TensorFlow's crashes the
process (a segmentation fault: both carry LLVM, and TensorFlow exports its
copy globally), and torch loads triton lazily, e.g. on the first torch.compile
or inside a bridged call. Import torchbridge (or torch, then `import triton`)
before TensorFlow:
    import torch
    import torchbridge
    import tensorflow as tf
or uninstall triton if you do not use torch.compile."""

# The handles of the libraries loaded here, kept for the process's lifetime
# (dropping a ctypes handle does not unload, but keeping it states intent).
_loaded: dict[str, ctypes.CDLL] = {}


def triton_library_path() -> str | None:
  """Where triton's native library is, found without importing triton."""
  try:
    spec = importlib.util.find_spec("triton")
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  for location in spec.submodule_search_locations:
    # The file `import triton._C.libtriton` would load: Python tries the
    # extension suffixes in this order.
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
      candidate = Path(location, "_C", "libtriton" + suffix)
      if candidate.is_file():
        return str(candidate)
  return None


def preloaded_triton() -> bool:
  """Whether `load_before_tensorflow` loaded triton's library itself."""
  return "triton" in _loaded


def _is_loaded(path: str) -> bool:
  """Whether the library at `path` is already mapped into this process."""
  try:
    ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
  except OSError:
    return False
  return True


def load_before_tensorflow() -> None:
  """Loads triton's library so that TensorFlow's symbols cannot capture it.

  Idempotent and cheap when there is nothing to do (no triton, not Linux,
  already loaded). Raises `ImportError` (see ORDER_MESSAGE) only where the
  process would otherwise crash later.
  """
  if not sys.platform.startswith("linux") or "triton" in _loaded:
    return
  if os.environ.get(PRELOAD_ENV, "1") == "0":
    return
  path = triton_library_path()
  if path is None or "triton._C.libtriton" in sys.modules or _is_loaded(path):
    # Not installed, or loaded already: if that happened after TensorFlow,
    # the process would not have survived it.
    return
  mode = os.RTLD_NOW | os.RTLD_LOCAL  # before TF: binds to itself
  if "tensorflow" in sys.modules:
    # After TF: only RTLD_DEEPBIND keeps it off TF's symbols. Not used
    # otherwise: a DEEPBIND library also binds malloc/free to glibc's past
    # an LD_PRELOADed allocator, and sanitizers refuse it.
    deepbind = getattr(os, "RTLD_DEEPBIND", None)
    if deepbind is None:
      raise ImportError(
        ORDER_MESSAGE.format(path=path, reason="this C library has no RTLD_DEEPBIND")
      )
    mode |= deepbind
  try:
    _loaded["triton"] = ctypes.CDLL(path, mode=mode)
  except OSError as error:
    # A broken triton install: `import triton` will fail the same way (an
    # ImportError that torch handles), before any initializer can run.
    _LOG.info("torchbridge: not preloading triton's library %s: %s", path, error)
