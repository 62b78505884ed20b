"""Builds the native op library from csrc/ and caches it, once per set-up.

The library is compiled on first use with the compiler flags of the
installed TensorFlow into a cache directory (`$TORCHBRIDGE_CACHE_DIR`, else
`~/.cache/torchbridge`), under a name keyed by the Python, TF, torch and
torchbridge versions, the flags and the sources; a later process with the
same set-up loads it without a compiler. Each C++ file compiles in a process
of its own, side by side, and one link makes the library. With torch's C++
headers and libraries at hand it includes csrc/torch_interop.cc (torch
tensors made in C++); if that build fails, it is built again without it.
Builds hold a file lock and rename their result into place, so concurrent
processes build once. `torchbridge._native.load()` calls this; nothing here
runs at import.
"""

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge import _adopt
from torchbridge import _stats

_LOG = logging.getLogger("torchbridge")

CACHE_ENV = "TORCHBRIDGE_CACHE_DIR"
_LIB_STEM = "torchbridge_op"
_OP_SOURCE = "torchbridge_op.cc"  # the file that registers the op
_INTEROP_SOURCE = "torch_interop.cc"  # the only one with torch's headers

# How many times this process compiled the library (tests read it).
build_count = 0


class BuildError(RuntimeError):
  """The library could not be built."""


def source_dir():
  """csrc/: inside the package (installed) or beside it (a checkout)."""
  here = Path(__file__).resolve().parent
  for candidate in (here / "csrc", here.parent / "csrc"):
    if (candidate / _OP_SOURCE).is_file():
      return candidate
  raise BuildError(f"{_OP_SOURCE} not found next to the torchbridge package")


def cache_dir():
  """Where built libraries are kept."""
  configured = os.environ.get(CACHE_ENV)
  if configured:
    return Path(configured).expanduser()
  return Path("~/.cache/torchbridge").expanduser()


def build_or_reuse():
  """The path of a built library for this set-up, building it if needed.

  Raises:
    BuildError: no compiler, or the build failed (the message names the
      log in the cache directory).
  """
  global build_count
  sources = source_dir()
  interop = _torch_interop_flags(sources)
  # The key leaves out which compiler builds it (any gives the same ABI), so
  # a library built once serves a process that has no compiler.
  digest = hashlib.sha256()
  for part in [_versions()] + [
      "\0".join(c) for c in _commands("CXX", sources, "OUT", interop)]:
    digest.update(part.encode() + b"\0")
  for path in sorted(sources.glob("*.[ch]*")):
    digest.update(path.name.encode() + b"\0" + path.read_bytes())
  key = digest.hexdigest()[:20]

  directory = cache_dir()
  target = directory / f"{_LIB_STEM}-{key}.so"
  if target.is_file():
    return target
  compiler = _find_compiler()
  directory.mkdir(parents=True, exist_ok=True)
  with _file_lock(directory / f"{_LIB_STEM}-{key}.lock"):
    if target.is_file():  # another process built it meanwhile
      return target
    with tempfile.TemporaryDirectory(dir=directory,
                                     prefix=f".{_LIB_STEM}-") as work:
      output = Path(work, target.name)
      log_path = directory / f"{_LIB_STEM}-{key}.log"
      _LOG.debug("torchbridge: building the native TF op into %s", target)
      build_count += 1
      failure = _run(_commands(compiler, sources, output, interop), log_path)
      if failure and interop:
        _LOG.debug("torchbridge: building with %s failed (%s); building "
                   "without it", _INTEROP_SOURCE, failure)
        failure = _run(_commands(compiler, sources, output, None),
                       log_path.with_suffix(".plain.log"))
      if failure:
        raise BuildError(failure)
      os.chmod(output, 0o755)  # a shared cache reads it
      os.replace(output, target)
  return target


def connect(path, *, dispatch, registry, export_output):
  """Links the loaded library at `path` to Python; whether it has
  csrc/torch_interop.cc.

  Checks that its constants (csrc/adopt_rules.h) agree with
  torchbridge/_adopt.py, hands it the Python functions it calls (once, as
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
  _stats.add_zero_copy_source(count)
  return bool(handle.torchbridge_has_torch_interop())


def _torch_interop_flags(sources):
  """(compile flags, link flags) of csrc/torch_interop.cc, or None.

  None when torch's C++ headers or libraries are missing; the op is then
  built without it and trades DLPack capsules with Python.
  """
  torch_dir = Path(torch.__file__).resolve().parent
  include, lib = torch_dir / "include", torch_dir / "lib"
  if not ((sources / _INTEROP_SOURCE).is_file() and
          (include / "ATen" / "DLConvertor.h").is_file() and
          (lib / "libtorch_python.so").is_file()):
    return None
  compile_flags = [
      # torch's headers ask for C++20 in places where C++17 compilers
      # accept an extension; TF's ask for C++17.
      "-Wno-c++20-extensions",
      "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch.compiled_with_cxx11_abi()),
      # After TF's include directory (earlier on the command line), so that
      # TF's files win where both ship one (google/protobuf); torch's own
      # (ATen, c10, torch) exist only here.
      "-I" + str(include),
      "-I" + str(include / "torch" / "csrc" / "api" / "include")]
  link_flags = ["-L" + str(lib), "-Wl,-rpath," + str(lib),
                "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
  return compile_flags, link_flags


def _commands(compiler, sources, output, interop):
  """The compile commands (one per C++ file, run side by side), then the
  link command, as a list of argument lists."""
  interop_define = "-DTORCHBRIDGE_TORCH_INTEROP=%d" % bool(interop)
  common = [compiler, "-std=c++17", "-fPIC", "-O2",
            "-I" + sysconfig.get_paths()["include"], "-I" + str(sources)]
  common += tf.sysconfig.get_compile_flags()
  if _gpu_build():
    common.append("-DTORCHBRIDGE_GPU=1")
  commands, objects = [], []
  for source in sorted(sources.glob("*.cc")):
    if source.name == _INTEROP_SOURCE and not interop:
      continue
    obj = f"{output}.{source.stem}.o"
    flags = interop[0] if source.name == _INTEROP_SOURCE else []
    commands.append(common + [interop_define] + flags +
                    ["-c", str(source), "-o", obj])
    objects.append(obj)
  link = [compiler, "-shared", "-o", str(output)] + objects
  link += tf.sysconfig.get_link_flags() + (interop[1] if interop else [])
  # Python's symbols come from the running interpreter; linking libpython
  # too is harmless where it is a shared library.
  libdir = sysconfig.get_config_var("LIBDIR")
  ldlibrary = sysconfig.get_config_var("LDLIBRARY") or ""
  if (sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and
      ldlibrary.startswith("lib") and (Path(libdir) / ldlibrary).exists()):
    link += ["-L" + libdir, "-l" + ldlibrary[3:].split(".so")[0]]
  return commands + [link]


def _run(commands, log_path):
  """Runs the compile commands side by side, then the link; None if all
  worked, else a one-line reason (the full output goes to `log_path`)."""
  *compiles, link = commands
  try:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for c in compiles]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    results = [(p.returncode, out) for p, out in zip(procs, outputs)]
    if all(code == 0 for code, _ in results):
      proc = subprocess.run(link, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=900,
                            check=False)
      results.append((proc.returncode, proc.stdout))
  except (OSError, subprocess.TimeoutExpired) as err:
    return f"compiler failed to run: {err}"
  failed = [out for code, out in results if code != 0]
  if not failed:
    return None
  log_path.write_text("\n".join(failed))
  first = next((line for line in failed[0].splitlines() if "error" in line),
               failed[0].strip()[:200])
  return (f"compiling the native op (csrc/) failed: {first.strip()} "
          f"(full log: {log_path})")


def _find_compiler():
  for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
    if name:
      path = shutil.which(name)
      if path:
        return path
  raise BuildError("no C++ compiler found (set CXX, or install g++)")


def _gpu_build():
  try:
    return bool(tf.sysconfig.get_build_info().get("is_cuda_build"))
  except Exception:  # pylint: disable=broad-except
    return False


def _versions():
  package = sys.modules.get("torchbridge")
  return "\n".join([
      sys.version, sys.platform, sysconfig.get_platform(),
      str(sys.implementation.cache_tag),
      "tf " + tf.__version__, "torch " + torch.__version__,
      "torchbridge " + str(getattr(package, "__version__", "?")),
  ])


@contextlib.contextmanager
def _file_lock(path):
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
