"""The native TF op `TorchbridgeCall` (csrc/torchbridge_op.cc) and its loader.

Inside `tf.function`, `TorchbridgeCall` calls a Python callable with its inputs
and adopts what it returns as outputs, without copies: DLPack capsules both
ways, or (`torch_tensors=True`, what the bridge uses) torch tensors, which
csrc/torch_interop.cc converts in C++. It replaces `tf.py_function` (no
EagerTensor wrapping, static output shapes, TF's CUDA stream handed to torch
on GPUs).

The library is built on first use (`load()`), with the compiler flags of the
installed TensorFlow, into a cache directory (`$TORCHBRIDGE_CACHE_DIR`, else
`~/.cache/torchbridge`) keyed by the Python, TF, torch and torchbridge
versions and the source. Nothing happens at import. When the op cannot be
had (`TORCHBRIDGE_DISABLE_NATIVE=1`, no compiler, a failed build or load),
one line is logged to the "torchbridge" logger and `available()` is False;
callers then use the `tf.py_function` path.

Callables are registered here under integer ids that the op carries as an
attribute; `_dispatch` is the single entry point the kernel calls. A graph's
registrations are dropped when the graph is garbage collected (as
`tf.py_function` does for its functions).
"""

import contextlib
import hashlib
import itertools
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import weakref
from pathlib import Path

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf
import torch.utils.dlpack as torch_dlpack

from torchbridge import _exchange

_LOG = logging.getLogger("torchbridge")

DISABLE_ENV = "TORCHBRIDGE_DISABLE_NATIVE"
CACHE_ENV = "TORCHBRIDGE_CACHE_DIR"
_SOURCE_NAME = "torchbridge_op.cc"
_INTEROP_SOURCE_NAME = "torch_interop.cc"
_LIB_STEM = "torchbridge_op"

_load_lock = threading.Lock()
_library = None  # the loaded op module, once loaded
_tried = False  # whether load() has run (successfully or not)
_status = "not loaded"  # one line: what load() did
# How many times this process compiled the library (tests read it).
build_count = 0


# ---------------------------------------------------------------------------
# Loading


def load():
  """Returns the loaded op library, building it on first use; None if not.

  Never raises: when the op cannot be had, logs one line to the
  "torchbridge" logger (info when disabled by `TORCHBRIDGE_DISABLE_NATIVE`,
  warning otherwise) and returns None, in this call and every later one.
  Thread-safe; the build also holds a file lock, so concurrent processes
  build once.
  """
  global _library, _tried, _status
  if _tried:
    return _library
  with _load_lock:
    if _tried:
      return _library
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
      _status = (f"torchbridge: native TF op disabled by {DISABLE_ENV}="
                 f"{os.environ[DISABLE_ENV]}; using the tf.py_function path")
      _LOG.info(_status)
    else:
      try:
        path = _build_or_reuse()
        _library = tf.load_op_library(str(path))
        _load_counters(path)
        # The op has no gradient of its own: callers wrap it in
        # tf.custom_gradient. Declared non-differentiable, a tape around a
        # tf.function that holds it gives None gradients instead of failing
        # the call with a LookupError.
        tf.no_gradient("TorchbridgeCall")
        _status = (f"torchbridge: native TF op loaded from {path} ("
                   + ("torch tensors made in C++" if _interop else
                      "DLPack capsules only: torch_interop.cc did not build")
                   + ")")
      except Exception as err:  # pylint: disable=broad-except
        _library = None
        _status = (f"torchbridge: native TF op unavailable ({_one_line(err)})"
                   f"; using the tf.py_function path (set {DISABLE_ENV}=1 to "
                   "skip the attempt)")
        _LOG.warning(_status)
    _tried = True
    return _library


_interop = False  # whether the loaded library has csrc/torch_interop.cc


def _load_counters(path):
  """Reads the library's C entry points: interop flag and zero-copy count."""
  global _interop
  import ctypes  # pylint: disable=import-outside-toplevel
  # The op library is loaded already; this opens the same handle.
  handle = ctypes.CDLL(str(path))
  _interop = bool(handle.torchbridge_has_torch_interop())
  count = handle.torchbridge_zero_copy_count
  count.restype = ctypes.c_int64
  count.argtypes = []
  _exchange.add_zero_copy_source(count)


def has_torch_interop():
  """Whether the loaded op hands torch tensors over itself (C++)."""
  return load() is not None and _interop


def available():
  """Whether the native op is in use (builds and loads it on first call)."""
  return not getattr(_python_path, "forced", False) and load() is not None


_python_path = threading.local()


@contextlib.contextmanager
def python_path():
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


native_available = available


def status():
  """One line saying what `load()` did (or "not loaded")."""
  return _status


def _one_line(err):
  text = " ".join(str(err).split())
  return text if len(text) <= 400 else text[:397] + "..."


class BuildError(RuntimeError):
  """The library could not be built."""


def _find_source():
  here = Path(__file__).resolve().parent
  for candidate in (here / "csrc" / _SOURCE_NAME,
                    here.parent / "csrc" / _SOURCE_NAME):
    if candidate.is_file():
      return candidate
  raise BuildError(f"{_SOURCE_NAME} not found next to the torchbridge package")


def _torch_interop_flags():
  """Sources and flags of the torch part (csrc/torch_interop.cc), or None.

  None when torch's C++ headers or libraries are missing; the op is then
  built from torchbridge_op.cc alone and trades DLPack capsules with Python.
  """
  source = _find_source().with_name(_INTEROP_SOURCE_NAME)
  torch_dir = Path(torch.__file__).resolve().parent
  include, lib = torch_dir / "include", torch_dir / "lib"
  if not (source.is_file() and (include / "ATen" / "DLConvertor.h").is_file()
          and (lib / "libtorch_python.so").is_file()):
    return None
  return [str(source), "-DTORCHBRIDGE_TORCH_INTEROP=1",
          # torch's headers ask for C++20 in places where C++17 compilers
          # accept an extension; TF's ask for C++17.
          "-Wno-c++20-extensions",
          "-D_GLIBCXX_USE_CXX11_ABI=%d" % torch._C._GLIBCXX_USE_CXX11_ABI,  # pylint: disable=protected-access
          # After TF's include directory (from its flags, earlier on the
          # command line), so that TF's files win where both ship one
          # (google/protobuf); torch's own (ATen, c10, torch) exist only here.
          "-I" + str(include),
          "-I" + str(include / "torch" / "csrc" / "api" / "include"),
          "-L" + str(lib), "-Wl,-rpath," + str(lib),
          "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def _find_compiler():
  for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
    if name:
      path = shutil.which(name)
      if path:
        return path
  raise BuildError("no C++ compiler found (set CXX, or install g++)")


def cache_dir():
  """Where built libraries are kept."""
  configured = os.environ.get(CACHE_ENV)
  if configured:
    return Path(configured).expanduser()
  return Path("~/.cache/torchbridge").expanduser()


def _gpu_build():
  try:
    return bool(tf.sysconfig.get_build_info().get("is_cuda_build"))
  except Exception:  # pylint: disable=broad-except
    return False


def _compile_command(compiler, source, output, interop=None):
  cmd = [compiler, "-std=c++17", "-shared", "-fPIC", "-O2", str(source),
         "-o", str(output), "-I" + sysconfig.get_paths()["include"]]
  cmd += tf.sysconfig.get_compile_flags()
  if _gpu_build():
    cmd.append("-DTORCHBRIDGE_GPU=1")
  cmd += tf.sysconfig.get_link_flags()
  cmd += interop or []
  # Python's symbols come from the running interpreter; linking libpython
  # too is harmless where it is a shared library.
  libdir = sysconfig.get_config_var("LIBDIR")
  ldlibrary = sysconfig.get_config_var("LDLIBRARY") or ""
  if (sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and
      ldlibrary.startswith("lib") and
      (Path(libdir) / ldlibrary).exists()):
    cmd += ["-L" + libdir, "-l" + ldlibrary[3:].split(".so")[0]]
  return cmd


def _versions():
  package = sys.modules.get("torchbridge")
  return "\n".join([
      sys.version, sys.platform, sysconfig.get_platform(),
      str(sys.implementation.cache_tag),
      "tf " + tf.__version__, "torch " + torch.__version__,
      "torchbridge " + str(getattr(package, "__version__", "?")),
  ])


def _build_or_reuse():
  """The path of a built library for this set-up, building it if needed.

  The library includes csrc/torch_interop.cc (torch's C++ API) when torch's
  headers and libraries are at hand; if that build fails, it is built again
  without it (the log of the failure stays in the cache directory).
  """
  global build_count
  source = _find_source()
  interop = _torch_interop_flags()
  # The key leaves out which compiler builds it (any gives the same ABI), so
  # a library built once serves a process that has no compiler.
  placeholder = _compile_command("CXX", "SOURCE", "OUTPUT", interop)
  digest = hashlib.sha256()
  for part in (_versions(), "\0".join(placeholder)):
    digest.update(part.encode())
    digest.update(b"\0")
  for path in sorted(source.parent.glob("*.[ch]*")):
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
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{_LIB_STEM}-",
                               suffix=".so.tmp")
    os.close(fd)
    log_path = directory / f"{_LIB_STEM}-{key}.log"
    try:
      _LOG.debug("torchbridge: building the native TF op into %s", target)
      build_count += 1
      failure = _compile(_compile_command(compiler, source, tmp, interop),
                         log_path)
      if failure and interop:
        _LOG.debug("torchbridge: building with torch_interop.cc failed (%s); "
                   "building without it", failure)
        failure = _compile(_compile_command(compiler, source, tmp),
                           log_path.with_suffix(".plain.log"))
      if failure:
        raise BuildError(failure)
      os.chmod(tmp, 0o755)  # mkstemp made it private; a shared cache reads it
      os.replace(tmp, target)
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  return target


def _compile(command, log_path):
  """Runs one compiler command; None if it worked, else a one-line reason."""
  try:
    proc = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=900, check=False)
  except (OSError, subprocess.TimeoutExpired) as err:
    return f"compiler failed to run: {err}"
  if proc.returncode == 0:
    return None
  log_path.write_text(proc.stdout)
  first = next((line for line in proc.stdout.splitlines() if "error" in line),
               proc.stdout.strip()[:200])
  return (f"compiling {_SOURCE_NAME} failed: {first.strip()} "
          f"(full log: {log_path})")


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


# ---------------------------------------------------------------------------
# Callbacks

_registry = {}  # callback id -> callable
_registry_lock = threading.Lock()
_next_id = itertools.count(1)


def _register(callback, graph):
  """Registers `callback`; with a graph, until that graph is collected."""
  with _registry_lock:
    callback_id = next(_next_id)
    _registry[callback_id] = callback
    if graph is not None:
      ids = getattr(graph, "_torchbridge_native_ids", None)
      if ids is None:
        ids = []
        graph._torchbridge_native_ids = ids  # pylint: disable=protected-access
        # The finalizer holds the list, not the graph.
        weakref.finalize(graph, _release, ids)
      ids.append(callback_id)
  return callback_id


def _release(ids):
  with _registry_lock:
    for callback_id in ids:
      _registry.pop(callback_id, None)


def registered_count():
  """How many callbacks are registered (tests read it)."""
  return len(_registry)


def _dispatch(callback_id, capsules, unused_outputs=None, cuda_stream=None,
              cuda_device=None, torch_tensors=False):
  """Called by the kernel, with the GIL: runs callback `callback_id`.

  `capsules` is a list of DLPack capsules, one per op input (torch tensors
  for a `torch_tensors` op). `unused_outputs` is None, or a tuple of the
  indices of the op's outputs that nothing in the running graph consumes;
  while the callback runs, `output_required(i)` tells it (a `torch_tensors`
  callback gets it as its second argument), and it may return None for
  those. The GPU kernel also passes TF's CUDA stream for the op (an int) and
  its device index; the callback then runs with that stream as torch's
  current stream, so torch's work is queued after TF's and before TF's next
  op. (The CPU kernel of a `torch_tensors` op calls its callback without
  coming here.)
  """
  callback = _registry.get(callback_id)
  if callback is None:
    raise RuntimeError(
        f"torchbridge native callback {callback_id} is not registered: the "
        "graph that built this TorchbridgeCall op was garbage collected, or "
        "the op was loaded from a serialized graph (e.g. a SavedModel), which "
        "cannot carry Python callables.")
  args = (capsules, unused_outputs) if torch_tensors else (capsules,)
  outer_unused = getattr(_op_call, "unused", None)
  _op_call.unused = unused_outputs
  try:
    if cuda_stream is None:
      return callback(*args)
    stream = torch.cuda.ExternalStream(cuda_stream, device=cuda_device)
    outer = getattr(_op_call, "device", None)
    _op_call.device = cuda_device
    try:
      with torch.cuda.device(cuda_device), torch.cuda.stream(stream):
        outs = callback(*args)
        # Torch tensors (the torch_tensors op) become capsules here, where
        # any copy this takes is queued on TF's stream.
        return [_to_capsule(o) if isinstance(o, torch.Tensor) else o
                for o in outs]
    finally:
      _op_call.device = outer
  finally:
    _op_call.unused = outer_unused


# Set while a kernel's callback runs on this thread: the op's unused outputs,
# and for the GPU kernel its CUDA device.
_op_call = threading.local()


def current_gpu():
  """The CUDA device index of the GPU kernel calling back on this thread."""
  return getattr(_op_call, "device", None)


def unused_outputs():
  """The indices of the running op's outputs that nothing consumes.

  For capsule callbacks (see `output_required`). An empty tuple outside a
  native op's callback and whenever the executor did not say.
  """
  return getattr(_op_call, "unused", None) or ()


def output_required(index):
  """Whether the running op's output `index` is consumed in its graph.

  For capsule callbacks. True outside a native op's callback (the
  `tf.py_function` path cannot tell) and whenever the executor did not say
  otherwise. (A `torch_tensors` callback gets the unused outputs as its
  second argument instead.)
  """
  unused = getattr(_op_call, "unused", None)
  return unused is None or index not in unused


@tf.autograph.experimental.do_not_convert
def call(callback, inputs_tf, out_dtypes, out_shapes=None, name=None,
         torch_tensors=False, whole_tensor_outputs=()):
  """Emits one `TorchbridgeCall` op that runs `callback` on `inputs_tf`.

  Args:
    callback: `callback(capsules) -> capsules`: receives a list of DLPack
      capsules (one per input, "dltensor", to be consumed with
      `torch.utils.dlpack.from_dlpack`) and returns a list or tuple of DLPack
      capsules (`torch.utils.dlpack.to_dlpack`), exactly one per declared
      output, each of the declared dtype and a compatible shape, dense
      row-major, 64-byte aligned, on the op's device (see `torch_callback`,
      which makes sure of that); or None for an output that
      `output_required` says nothing consumes. It is called on TF's threads,
      possibly from several at once. With `torch_tensors`, it receives and
      returns torch tensors instead (see below).
    inputs_tf: list of TF tensors.
    out_dtypes: list of TF dtypes of the outputs.
    out_shapes: list of shapes (`tf.TensorShape`, lists with None for
      unknown dimensions, or None for unknown rank), one per output; they are
      the outputs' static shapes in the graph and are checked at run time.
      None: all unknown.
    name: name of the op.
    torch_tensors: whether `callback` takes a list of torch tensors (zero-copy
      views of the inputs) and returns a list of torch tensors (or None for
      unused outputs). The op then converts both ways in C++
      (csrc/torch_interop.cc), adopting outputs that TF can use as they are
      without a copy and handing the others to `tf_viewable` (one counted
      copy); with a library built without that file, `torch_callback` does
      the same in Python.
    whole_tensor_outputs: with `torch_tensors`, the indices of the outputs
      whose torch tensors TF holds whole, so that their Python objects (and
      attributes set on them) live as long as TF's buffer, as with torch's
      DLPack export. Other outputs hold only their memory: cheaper to
      release, and the Python object dies when Python drops it.

  Returns:
    List of TF tensors, one per output.

  Raises:
    RuntimeError: if the native op is not available (check `available()`).

  In a graph (`tf.function`), `callback` stays registered as long as the
  graph lives. Eagerly, the op runs at once and the registration ends.
  """
  lib = load()
  if lib is None:
    raise RuntimeError(
        f"the torchbridge native TF op is not available ({_status}); check "
        "torchbridge._native.available() before calling call()")
  out_dtypes = [tf.as_dtype(d) for d in out_dtypes]
  if out_shapes is None:
    shapes = []
  else:
    shapes = [tf.TensorShape(s) for s in out_shapes]
    if len(shapes) != len(out_dtypes):
      raise ValueError(f"{len(shapes)} out_shapes for {len(out_dtypes)} "
                       "out_dtypes")
  if torch_tensors and not _interop:
    callback, torch_tensors = torch_callback(callback), False
  eager = tf.executing_eagerly()
  graph = None if eager else tf.compat.v1.get_default_graph()
  callback_id = _register(callback, graph)
  try:
    outs = lib.torchbridge_call(
        inputs=list(inputs_tf), Tout=out_dtypes, output_shapes=shapes,
        callback_id=callback_id, torch_tensors=torch_tensors,
        whole_tensor_outputs=list(whole_tensor_outputs) if torch_tensors
        else [], name=name)
  except BaseException:
    _release([callback_id])
    raise
  if not out_dtypes:
    outs = []  # the wrapper returns the Operation
  if eager:
    if not tf.config.experimental.get_synchronous_execution():
      from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
      context.async_wait()
    _release([callback_id])
  return list(outs)


# ---------------------------------------------------------------------------
# Torch-side helper


# The capsule-level DLPack functions; torch.utils.dlpack.from_dlpack is a
# Python wrapper that first asks whether its argument is a capsule.
_from_dlpack = getattr(torch._C, "_from_dlpack", torch_dlpack.from_dlpack)  # pylint: disable=protected-access
_to_dlpack = torch_dlpack.to_dlpack


@tf.autograph.experimental.do_not_convert  # else the callback runs converted
def torch_callback(fn):
  """Wraps `fn(torch tensors, unused) -> torch tensors` for `call`.

  `fn` gets a list of torch tensors and the op's unused outputs (None, or a
  tuple of indices: see `output_required`), as a `torch_tensors` callback
  does.

  Inputs arrive as zero-copy torch views of the TF tensors. Each output is
  handed back zero-copy when TF can use its memory as it is (dense,
  row-major, 64-byte aligned); otherwise one aligned copy is made and
  counted in `torchbridge.exchange_stats()`, as `to_tf` does. Outputs that
  require grad are detached (their graph stays with whoever holds them).
  `fn` may return None for an output that `output_required` says is unused.
  """

  def callback(capsules):
    args = [_from_dlpack(c) for c in capsules]
    outs = fn(args, getattr(_op_call, "unused", None))
    if getattr(_op_call, "device", None) is not None:
      capsules_out = [_to_capsule(o) for o in outs]
      _exchange.count_zero_copy(len(args))
      return capsules_out
    # The CPU kernel: outputs that are dense, row-major, aligned and hold
    # their own values (no lazy conjugation or negation) are exported as
    # they are (DLPack ignores requires_grad); the kernel checks dtype,
    # shape and device again, so nothing here can let a bad buffer through.
    capsules_out = []
    as_they_are = 0
    for out in outs:
      if (type(out) is torch.Tensor and  # pylint: disable=unidiomatic-typecheck
          out.layout is torch.strided and out.is_cpu and
          out.is_contiguous() and
          out.data_ptr() % _exchange.TF_ALIGNMENT == 0 and
          not (out.is_conj() or out.is_neg())):
        capsules_out.append(_to_dlpack(out))
        as_they_are += 1
      else:
        capsules_out.append(_to_capsule(out))
    _exchange.count_zero_copy(len(args) + as_they_are)
    return capsules_out

  return callback


def _export_output(out_torch, index, gpu):
  """Called by the CPU kernel of a torch_tensors op for an output it cannot
  adopt as it is: a DLPack capsule TF can adopt (see `_to_capsule`)."""
  if out_torch is None:
    raise TypeError(
        f"output {index} of the torch callback is None, but the graph uses "
        "it; return a torch.Tensor")
  if not isinstance(out_torch, torch.Tensor):
    raise TypeError(
        f"output {index} of the torch callback is a "
        f"{type(out_torch).__name__}, not a torch.Tensor; return it as a "
        "tensor, e.g. torch.tensor(value)")
  return _viewable_capsule(out_torch, gpu)


def _to_capsule(x_torch):
  if x_torch is None:
    return None  # the kernel accepts it only for an unused output
  if not isinstance(x_torch, torch.Tensor):
    raise TypeError(f"torch code returned a {type(x_torch).__name__}, not a "
                    "torch.Tensor")
  return _viewable_capsule(x_torch, current_gpu())


def _viewable_capsule(x_torch, gpu):
  """A capsule of `x_torch` as TF can adopt it (one counted copy if need
  be), for the kernel running on CUDA device `gpu` (None: the CPU kernel)."""
  device = None
  if gpu is not None:
    # The GPU kernel wants its outputs in GPU memory, except int32, which TF
    # keeps in host memory on GPUs.
    device = (torch.device("cpu") if x_torch.dtype == torch.int32 else
              torch.device("cuda", gpu))
  return _to_dlpack(_exchange.tf_viewable(x_torch, device=device))
