"""Builds the native op library from csrc/ and caches it, once per set-up.

The library is compiled on first use (or ahead of time by
`python -m torchbridge build`) into a cache directory
(`$TORCHBRIDGE_CACHE_DIR`, else `~/.cache/torchbridge`), under a name keyed
by the Python, TF, torch and torchbridge versions, the flags and the
sources; a later process with the same set-up loads it without a compiler.

Two translation units, compiled side by side, then one link:
  - TF's side: every csrc/ file but torch_interop.cc, included into one
    generated file and compiled once with TensorFlow's flags (C++17). One
    unit parses TF's heavy headers once instead of once per file: 7-8 s
    here, against 29 s for the five files compiled one by one.
  - torch's side: csrc/torch_interop.cc alone, with torch's headers and the
    language standard they require (C++20 since torch 2.14; the same flag
    torch.utils.cpp_extension passes), and nothing of TF's. The interface
    between the two (torch_interop.h) is plain C types.
If torch's side cannot be built (no headers, a compiler without C++20), the
library is built without it (the op then trades DLPack capsules with
Python), and the reason and the failed build's log are recorded beside the
library, so every process that loads it says why, once, at WARNING.

A build says through the "torchbridge" logger when it starts (what, why,
where, about how long) and when it ends; with no logging configured, those
lines go to stderr. Builds hold a file lock and rename their result into
place, so concurrent processes build once. `torchbridge._native._loader.load()` and
the command line call this; nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._crossing import _adopt
from torchbridge._native import _compiler
from torchbridge._runtime import _omp_team
from torchbridge._crossing import _stats

_LOG = logging.getLogger("torchbridge")

CACHE_ENV = "TORCHBRIDGE_CACHE_DIR"
_LIB_STEM = "torchbridge_op"
_OP_SOURCE = "torchbridge_op.cc"  # the file that registers the op

BuildError = _compiler.BuildError

# How many times this process compiled the library (tests read it).
build_count = 0


def source_dir() -> Path:
  """csrc/: inside the package (installed) or beside it (a checkout)."""
  package = Path(__file__).resolve().parents[1]  # torchbridge/
  for candidate in (package / "csrc", package.parent / "csrc"):
    if (candidate / _OP_SOURCE).is_file():
      return candidate
  raise BuildError(f"{_OP_SOURCE} not found next to the torchbridge package")


def cache_dir() -> Path:
  """Where built libraries are kept."""
  configured = os.environ.get(CACHE_ENV)
  if configured:
    return Path(configured).expanduser()
  return Path("~/.cache/torchbridge").expanduser()


def library_path() -> Path:
  """Where this set-up's library is (or would be) cached; no build."""
  sources = source_dir()
  interop = _compiler.torch_interop_flags(sources)
  # The key leaves out which compiler builds it (any gives the same ABI), so
  # a library built once serves a process that has no compiler.
  digest = hashlib.sha256()
  plan = _compiler.plan("CXX", sources, "OUT", interop)
  for part in [_versions()] + ["\0".join(c) for c in plan.compiles]:
    digest.update(part.encode() + b"\0")
  for path in sorted(sources.glob("*.[ch]*")):
    digest.update(path.name.encode() + b"\0" + path.read_bytes())
  return cache_dir() / f"{_LIB_STEM}-{digest.hexdigest()[:20]}.so"


def build_record(path: str | os.PathLike[str]) -> dict[str, Any]:
  """What the build of the library at `path` recorded beside it, as a dict:
  `complete` (whether it has torch_interop.cc), `reason` (why not), `log`
  (the failed attempt's log), `seconds`, `compiler`, `built` (a date);
  {} for a library built before such records were kept."""
  try:
    return json.loads(Path(path).with_suffix(".json").read_text())
  except (OSError, ValueError):
    return {}


def build_or_reuse(force: bool = False) -> Path:
  """The path of a built library for this set-up, building it if needed.

  Args:
    force: build again even if a library is cached (e.g. after installing
      a newer compiler where the last build had to fall back).

  Raises:
    BuildError: no compiler, or the build failed (the message names the
      log in the cache directory).
  """
  return build_once(library_path(), _build, force)


def build_once(target: Path, build: Callable[[str, Path], None], force: bool = False) -> Path:
  """`target`, made by `build(compiler, target)` unless it exists (or with
  `force`), under a file lock beside it: concurrent processes build once."""
  if target.is_file() and not force:
    return target
  compiler = _compiler.find_compiler()
  target.parent.mkdir(parents=True, exist_ok=True)
  with _file_lock(target.with_suffix(".lock")):
    if target.is_file() and not force:  # another process built it meanwhile
      return target
    build(compiler, target)
  return target


def _build(compiler: str, target: Path) -> None:
  global build_count
  sources = source_dir()
  interop = _compiler.torch_interop_flags(sources)
  directory = target.parent
  last = _last_build_seconds(directory)
  _say(
    logging.INFO,
    "torchbridge: building the native TF op for this set-up (TF %s, "
    "torch %s; first use, or the set-up changed) with %s into %s. This "
    "happens once per set-up and takes %s; `python -m torchbridge build` "
    "does it ahead of time.",
    tf.__version__,
    torch.__version__,
    compiler,
    directory,
    f"about {last:.0f} s (the last build here)" if last else "10-30 s on 2 cores",
  )
  started = time.monotonic()
  build_count += 1
  record: dict[str, Any] = {"complete": bool(interop), "reason": None, "log": None}
  record["compiler"] = compiler
  if interop is None:
    record["reason"] = (
      "torch's C++ headers or libraries are not installed (looked for "
      "torch/include/ATen/DLConvertor.h and torch/lib/libtorch_python.so)"
    )
  with tempfile.TemporaryDirectory(dir=directory, prefix=f".{_LIB_STEM}-") as work:
    output = Path(work, target.name)
    log_path = target.with_suffix(".log")
    failure = _compiler.run(_compiler.plan(compiler, sources, output, interop), log_path)
    if failure and interop:
      record.update(
        complete=False,
        log=str(log_path),
        reason=(
          f"{_compiler.INTEROP_SOURCE} (torch's side, {_compiler.TORCH_STD}) did not build: "
          f"{failure}"
        ),
      )
      failure = _compiler.run(
        _compiler.plan(compiler, sources, output, None), target.with_suffix(".plain.log")
      )
    if failure:
      _say(
        logging.INFO,
        "torchbridge: the native TF op did not build (%.1f s): %s",
        time.monotonic() - started,
        failure,
      )
      raise BuildError(failure)
    os.chmod(output, 0o755)  # a shared cache reads it
    record["seconds"] = round(time.monotonic() - started, 2)
    record["built"] = time.strftime("%Y-%m-%d %H:%M:%S")
    _write_atomically(target.with_suffix(".json"), json.dumps(record))
    os.replace(output, target)
  _say(
    logging.INFO,
    "torchbridge: built the native TF op in %.1f s (%s): %s",
    record["seconds"],
    "complete" if record["complete"] else "without torch's side",
    target,
  )


def connect(
  path: str | os.PathLike[str],
  *,
  dispatch: Callable[..., Any],
  registry: dict[int, Callable[..., Any]],
  export_output: Callable[..., Any],
) -> bool:
  """Links the loaded library at `path` to Python; whether it has
  csrc/torch_interop.cc.

  Checks that its constants (csrc/adopt_rules.h) agree with
  torchbridge/_crossing/_adopt.py, hands it the Python functions it calls (once, as
  TF's py_func registers its trampoline) and adds its zero-copy counter to
  `exchange_stats()`. Raises RuntimeError on a disagreement.
  """
  # The op library is loaded already (tf.load_op_library); these open the
  # same handle. PyDLL keeps the GIL during the call, as
  # torchbridge_set_python_hooks needs.
  handle = ctypes.CDLL(str(path))
  with_gil = ctypes.PyDLL(str(path))
  alignment = handle.torchbridge_alignment
  alignment.restype = ctypes.c_int64
  dtype_table = handle.torchbridge_dtype_table
  dtype_table.restype = ctypes.c_char_p
  _adopt.check_native_constants(alignment(), dtype_table().decode())
  set_hooks = with_gil.torchbridge_set_python_hooks
  set_hooks.argtypes = [ctypes.py_object] * 3
  set_hooks.restype = ctypes.c_int
  set_hooks(dispatch, registry, export_output)
  count = handle.torchbridge_zero_copy_count
  count.restype = ctypes.c_int64
  count.argtypes = []
  _stats.add_source(lambda: (count(), 0, 0))
  handle.torchbridge_set_team_release.argtypes = [ctypes.c_void_p]
  handle.torchbridge_set_team_release(_omp_team.pause_address())
  return bool(handle.torchbridge_has_torch_interop())


def _versions() -> str:
  package = sys.modules.get("torchbridge")
  return "\n".join(
    [
      sys.version,
      sys.platform,
      sysconfig.get_platform(),
      str(sys.implementation.cache_tag),
      "tf " + tf.__version__,
      "torch " + torch.__version__,
      "torchbridge " + str(getattr(package, "__version__", "?")),
    ]
  )


def _last_build_seconds(directory: Path) -> float | None:
  """How long the newest recorded build in `directory` took, or None."""
  records = sorted(directory.glob(f"{_LIB_STEM}-*.json"), key=lambda p: p.stat().st_mtime)
  for path in reversed(records):
    seconds = build_record(path.with_suffix(".so")).get("seconds")
    if seconds:
      return seconds
  return None


def _write_atomically(path: Path, text: str) -> None:
  partial = path.with_name(f".{path.name}.{os.getpid()}")
  partial.write_text(text)
  os.replace(partial, path)


# A build takes half a minute, which in silence looks like a hung program:
# its lines reach stderr unless the user's logging shows them or the
# "torchbridge" logger was set above their level (the way to silence them).
_STDERR = logging.StreamHandler(sys.stderr)
_STDERR.setFormatter(logging.Formatter("%(message)s"))


def _say(level: int, message: str, *args: object) -> None:
  """Logs to "torchbridge"; to stderr where the configuration hides it."""
  if _LOG.isEnabledFor(level) and _LOG.hasHandlers():
    _LOG.log(level, message, *args)
  elif _LOG.level == logging.NOTSET or _LOG.level <= level:
    _STDERR.setStream(sys.stderr)  # the current one (tests replace it)
    _STDERR.handle(_LOG.makeRecord(_LOG.name, level, __file__, 0, message, args, None))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
  try:
    import fcntl  # pylint: disable=import-outside-toplevel
  except ImportError:  # not POSIX: os.replace still keeps builds atomic
    yield
    return
  with open(path, "a+") as handle:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
