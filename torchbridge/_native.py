"""The native TF op `TorchbridgeCall` at run time: loading, callbacks, emission.

Inside `tf.function`, `TorchbridgeCall` (csrc/) calls a Python callable with
its inputs and adopts what it returns as outputs, without copies: torch
tensors made in C++ (`torch_tensors=True`, what the bridge uses), or DLPack
capsules both ways. It replaces `tf.py_function` (no EagerTensor wrapping,
static output shapes, TF's CUDA stream handed to torch on GPUs).

`load()` builds the library on first use (`_native_build`), loads it, and
hands it the three Python functions it calls (`_dispatch`, `_registry`,
`_adopt.export_output`), once, as TF's own py_func registers its trampoline.
Nothing happens at import. When the op cannot be had
(`TORCHBRIDGE_DISABLE_NATIVE=1`, no compiler, a failed build or load), one
line is logged to the "torchbridge" logger and `available()` is False;
callers then use the `tf.py_function` path.

Callables are registered here under integer ids that the op carries as an
attribute. A graph's registrations are dropped when the graph is garbage
collected (as `tf.py_function` does for its functions).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf
import torch.utils.dlpack as torch_dlpack

from torchbridge import _adopt
from torchbridge import _compat
from torchbridge import _native_build
from torchbridge import _placement
from torchbridge import _stats
from torchbridge import _timeline

_LOG = logging.getLogger("torchbridge")

DISABLE_ENV = "TORCHBRIDGE_DISABLE_NATIVE"

_load_lock = threading.Lock()
_library = None  # the loaded op module, once loaded
_tried = False  # whether load() has run (successfully or not)
_status = "not loaded"  # one line: what load() did
_interop = False  # whether the loaded library has csrc/torch_interop.cc
_library_path = None  # the file it was loaded from


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
  global _library, _tried, _status, _interop, _library_path
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
        path = _native_build.build_or_reuse()
        _library = tf.load_op_library(str(path))
        _interop = _native_build.connect(
            path, dispatch=_dispatch, registry=_registry,
            export_output=_adopt.export_output)
        # The op has no gradient of its own: callers wrap it in
        # tf.custom_gradient. Declared non-differentiable, a tape around a
        # tf.function that holds it gives None gradients instead of failing
        # the call with a LookupError.
        tf.no_gradient("TorchbridgeCall")
        _timeline.connect(path)
        _library_path = path
        if _interop:
          _status = (f"torchbridge: native TF op loaded from {path} "
                     "(complete: torch tensors made in C++)")
        else:
          reason = _native_build.build_record(path).get("reason") or (
              "built without csrc/torch_interop.cc")
          _status = (f"torchbridge: native TF op loaded from {path} without "
                     f"its torch side, trading DLPack capsules with Python "
                     f"(slower per call): {reason}. After fixing that, "
                     "rebuild with `python -m torchbridge build --force`")
          _LOG.warning(_status)
      except Exception as err:  # pylint: disable=broad-except
        _library = None
        _status = (f"torchbridge: native TF op unavailable ({_one_line(err)})"
                   f"; using the tf.py_function path (set {DISABLE_ENV}=1 to "
                   "skip the attempt)")
        _LOG.warning(_status)
    _tried = True
    return _library


def has_torch_interop():
  """Whether the loaded op hands torch tensors over itself (C++)."""
  return load() is not None and _interop


def available() -> bool:
  """Whether the native op is in use (builds and loads it on first call).

  Examples:
    >>> import torchbridge as tb
    >>> isinstance(tb.native_available(), bool)
    True
  """
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


def loaded_from():
  """The file the op was loaded from, or None (not loaded, or not had)."""
  return _library_path


def _one_line(err):
  text = " ".join(str(err).split())
  return text if len(text) <= 400 else text[:397] + "..."


# ---------------------------------------------------------------------------
# Callbacks

_registry: dict[int, Callable[..., Any]] = {}  # callback id -> callable
_registry_lock = threading.Lock()
_next_id = itertools.count(1)
# graph -> the ids registered for it (weakly: the graph owns them).
_ids_of_graph: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _register(callback, graph):
  """Registers `callback`; with a graph, until that graph is collected."""
  with _registry_lock:
    callback_id = next(_next_id)
    _registry[callback_id] = callback
    if graph is not None:
      ids = _ids_of_graph.get(graph)
      if ids is None:
        ids = _ids_of_graph[graph] = []
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
    with _placement.on_tf_stream(cuda_stream, cuda_device):
      outs = callback(*args)
      # Torch tensors (the torch_tensors op) become capsules here, where
      # any copy this takes is queued on TF's stream.
      return [_to_capsule(o) if isinstance(o, torch.Tensor) else o
              for o in outs]
  finally:
    _op_call.unused = outer_unused


# Set while a kernel's callback runs on this thread: the op's unused outputs
# (the GPU kernel's device is `_placement.current_gpu()`).
_op_call = threading.local()


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
    _compat.wait_for_async_eager()
    _release([callback_id])
  return list(outs)


# ---------------------------------------------------------------------------
# Torch tensors and capsules


# The capsule-level DLPack functions; torch.utils.dlpack.from_dlpack is a
# Python wrapper that first asks whether its argument is a capsule.
_from_dlpack = _compat.torch_from_capsule
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
    if _placement.current_gpu() is not None:
      capsules_out = [_to_capsule(o) for o in outs]
      _stats.count_zero_copy(len(args))
      return capsules_out
    # The CPU kernel: outputs TF can adopt as they are go as they are
    # (DLPack ignores requires_grad); the kernel checks dtype, shape and
    # device again, so nothing here can let a bad buffer through.
    capsules_out = []
    as_they_are = 0
    for out in outs:
      if (type(out) is torch.Tensor and out.is_cpu and  # pylint: disable=unidiomatic-typecheck
          _adopt.can_adopt_as_is(out)):
        capsules_out.append(_to_dlpack(out))
        as_they_are += 1
      else:
        capsules_out.append(_to_capsule(out))
    _stats.count_zero_copy(len(args) + as_they_are)
    return capsules_out

  return callback


def _to_capsule(x_torch):
  if x_torch is None:
    return None  # the kernel accepts it only for an unused output
  return _adopt.export_output(x_torch, None, _placement.current_gpu())
