"""The native op's Python callbacks: the registry the kernel reads, the
dispatch it calls, and the DLPack form of a torch callback.

Callables are registered under integer ids that the op carries as an
attribute. A graph's registrations are dropped when the graph is garbage
collected (as `tf.py_function` does for its functions).

Each process counts its ids from a random start in [2**61, 2**62): a graph
serialized in one process (`tf.saved_model.save` writes the op and its id)
and run in another then finds no callback under its id and fails, saying
why, instead of running whichever callback that process registered under
the same small number (the same code run again registers the same ones,
with other weights).
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import tensorflow as tf
import torch.utils.dlpack as torch_dlpack

from torchbridge._crossing import _adopt
from torchbridge._crossing import _stats
from torchbridge._frameworks import _compat
from torchbridge._runtime import _placement


registry: dict[int, Callable[..., Any]] = {}  # callback id -> callable
# callback id -> its op's output shapes at concrete input shapes (`register`)
output_shape_functions: dict[int, Callable[..., Any]] = {}
# Reentrant: a graph collected while `register` holds it runs `release`
# (its finalizer) on the same thread.
_registry_lock = threading.RLock()
_next_id = itertools.count((1 << 61) + secrets.randbelow(1 << 60))
_native_ids: set[int] = set()  # the ids of the NativeCallbacks registered
# graph -> the ids registered for it (weakly: the graph owns them).
_ids_of_graph: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class NativeCallback:
  """A C function the op's CPU kernel runs instead of Python.

  `function` is the address of a `torchbridge::NativeCallback`
  (csrc/native_callback.h: DLPack tensors in and out, no GIL) and `context`
  the pointer it is called with, which must stay valid while the op's
  graph lives and any call of it runs; `owner` is held as long as the
  registration (the object that owns `context`, where Python owns it). Passed to `_op.call` in place of
  a Python callable: its calls then run no Python at all
  (benchmarks/scripted_native.py measures what that saves).
  """

  function: int
  context: int
  owner: Any = dataclasses.field(default=None, compare=False, repr=False)

  def __call__(self, *unused: Any) -> Any:
    # The kernel calls Python only where it cannot run the C function.
    raise RuntimeError(
      "a C++ callback runs only in the native op's CPU kernel; this call "
      "reached Python (a GPU kernel, or a library loaded without "
      "torchbridge_set_native_callback). Place the op on the CPU."
    )


# torchbridge_set_native_callback(id, function, context) of the loaded
# library (ctypes), once the loader has connected it.
_set_native: Callable[[int, int | None, int | None], None] | None = None


def connect_native(set_native: Callable[[int, int | None, int | None], None]) -> None:
  """Called by the loader with the library's C entry point."""
  global _set_native
  _set_native = set_native


def register(
  callback: Callable[..., Any],
  graph: tf.Graph | None,
  output_shapes: Callable[..., Any] | None = None,
) -> int:
  """Registers `callback`; with a graph, until that graph is collected.

  A graph's callbacks are held by the graph and only weakly by the
  registry (`_compat.held_by_graph`).
  A `NativeCallback` is registered with the library too (its C function
  then runs in place of Python). `output_shapes`: see `_op.call`.
  """
  if isinstance(callback, NativeCallback) and _set_native is None:
    raise RuntimeError("a C++ callback needs the native op loaded (_loader.load())")
  with _registry_lock:
    callback_id = next(_next_id)
    registry[callback_id] = callback
    if output_shapes is not None:
      output_shape_functions[callback_id] = output_shapes
    if graph is not None:
      try:
        registry[callback_id] = _compat.held_by_graph(callback, graph)
        if output_shapes is not None:
          output_shape_functions[callback_id] = _compat.held_by_graph(output_shapes, graph)
      except TypeError:
        pass  # not weakly referable: the registry holds it until `release`
    if isinstance(callback, NativeCallback) and _set_native is not None:
      _set_native(callback_id, callback.function, callback.context)
      _native_ids.add(callback_id)
    if graph is not None:
      ids = _ids_of_graph.get(graph)
      if ids is None:
        ids = _ids_of_graph[graph] = []
        # The finalizer holds the list, not the graph.
        weakref.finalize(graph, release, ids)
      ids.append(callback_id)
  return callback_id


def release(ids: Sequence[int]) -> None:
  with _registry_lock:
    for callback_id in ids:
      registry.pop(callback_id, None)
      output_shape_functions.pop(callback_id, None)
      if callback_id in _native_ids:
        _native_ids.discard(callback_id)
        if _set_native is not None:
          _set_native(callback_id, None, None)


def registered_count() -> int:
  """How many callbacks are registered (tests read it)."""
  return len(registry)


def native_count() -> int:
  """How many of them are C++ callbacks (benchmarks and tests read it)."""
  with _registry_lock:
    return len(_native_ids)


def dispatch(
  callback_id: int,
  capsules: list[Any],
  unused_outputs: tuple[int, ...] | None = None,
  cuda_stream: int | None = None,
  cuda_device: int | None = None,
  torch_tensors: bool = False,
) -> Any:
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
  callback = registry.get(callback_id)
  if callback is None:
    raise RuntimeError(
      f"torchbridge native callback {callback_id} is not registered: the "
      "graph that built this TorchbridgeCall op was garbage collected, or "
      "the op was loaded from a serialized graph (e.g. a SavedModel), which "
      "cannot carry torch: a graph call that runs torch (run='torch', or "
      "run='auto' where the translation could not hold) runs only in the "
      "process that traced it. Save a module whose calls run its TF "
      "translation (run='auto' or run='tf') instead."
    )
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
      return [_to_capsule(o) if isinstance(o, torch.Tensor) else o for o in outs]
  finally:
    _op_call.unused = outer_unused


def output_shapes(
  callback_id: int,
  input_shapes: list[tuple[int, ...]],
  input_dtypes: list[int],
  declared: list[tuple[int, ...]],
) -> list[list[int]]:
  """Called by the op library when XLA compiles an op whose declared output
  shapes are not all known (csrc/host_call.cc, with the GIL, on the torch
  thread): its outputs' shapes, every dimension known, for inputs of
  `input_shapes` and `input_dtypes` (TF's DataType codes). `declared`
  holds the shapes the op declared (-1 for an unknown dimension).
  """
  find = output_shape_functions.get(callback_id)
  if find is None:
    raise RuntimeError(
      f"torchbridge: the op of callback {callback_id} declares output shapes "
      f"{declared} (-1: unknown), and nothing can find them now that XLA "
      "compiles it (its graph was collected). Compile without XLA (jit_compile=False)."
    )
  specs = [tf.TensorSpec(s, tf.as_dtype(d)) for s, d in zip(input_shapes, input_dtypes)]
  shapes = find(specs, [tf.TensorShape([None if d < 0 else d for d in s]) for s in declared])
  return [[int(d) for d in tf.TensorShape(s).as_list()] for s in shapes]


# Set while a kernel's callback runs on this thread: the op's unused outputs
# (the GPU kernel's device is `_placement.current_gpu()`).
_op_call = threading.local()


def unused_outputs() -> tuple[int, ...]:
  """The indices of the running op's outputs that nothing consumes.

  For capsule callbacks (see `output_required`). An empty tuple outside a
  native op's callback and whenever the executor did not say.
  """
  return getattr(_op_call, "unused", None) or ()


def output_required(index: int) -> bool:
  """Whether the running op's output `index` is consumed in its graph.

  For capsule callbacks. True outside a native op's callback (the
  `tf.py_function` path cannot tell) and whenever the executor did not say
  otherwise. (A `torch_tensors` callback gets the unused outputs as its
  second argument instead.)
  """
  unused = getattr(_op_call, "unused", None)
  return unused is None or index not in unused


# The capsule-level DLPack functions; torch.utils.dlpack.from_dlpack is a
# Python wrapper that first asks whether its argument is a capsule.
_from_dlpack = _compat.torch_from_capsule
_to_dlpack = torch_dlpack.to_dlpack


@tf.autograph.experimental.do_not_convert  # else the callback runs converted
def torch_callback(
  fn: Callable[[list[torch.Tensor], tuple[int, ...] | None], Sequence[torch.Tensor | None]],
) -> Callable[[Sequence[Any]], list[Any]]:
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

  def callback(capsules: Sequence[Any]) -> list[Any]:
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
      if (
        type(out) is torch.Tensor
        and out.is_cpu  # pylint: disable=unidiomatic-typecheck
        and _adopt.can_adopt_as_is(out)
      ):
        capsules_out.append(_to_dlpack(out))
        as_they_are += 1
      else:
        capsules_out.append(_to_capsule(out))
    _stats.count_zero_copy(len(args) + as_they_are)
    return capsules_out

  return callback


def _to_capsule(x_torch: torch.Tensor | None) -> Any:
  if x_torch is None:
    return None  # the kernel accepts it only for an unused output
  return _adopt.export_output(x_torch, None, _placement.current_gpu())
