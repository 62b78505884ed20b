"""A bridge with no Python per call: the floor of "the module's Python off
the call path", measured.

`ScriptedTorchModule` stands where a `tb.TorchModule` stood, as
`bare_native.LeanTorchModule` does, on the same native op and variables,
but its calls never enter Python: the torch module is traced once
(`torch.jit.trace` with the parameters swapped for the traced function's
inputs, as TF hands them to each call) and each forward and backward op
runs it from C++ (torchbridge's own C++ call path, csrc/traced/, through
the ops' C++ callbacks, `csrc/native_callback.h`): no GIL, no Python
frame, no parameter swap, the module's own Python replaced by
TorchScript's interpreter and autograd run in C++. It is
`TorchModule(torchscript=True)`'s path with none of the wrapper around it
(binding, modes, checks, the fallbacks); it was measured first with a
copy of that runner of its own, then merged into it. Its floor,
`NoPythonFloorModule`, hands back fresh torch tensors from C++
(`benchmarks/csrc/scripted_call.cc`).

For the benchmarks only: float32, fixed shapes, no double backward.
"""

import ctypes
from pathlib import Path

import tensorflow as tf
import torch

from benchmarks import bare_native
from torchbridge._native import _callbacks
from torchbridge._native import _compiler
from torchbridge._native import _loader
from torchbridge._native import _op
from torchbridge._native import _traced
from torchbridge._runtime import _omp_team

_SOURCE = Path(__file__).resolve().parent / "csrc" / "scripted_call.cc"
_library = None


def library():
  """The floor's C++ callback library, built on first use and cached."""
  global _library
  if _library is not None:
    return _library
  # Built as torchbridge builds its own torch-side library (cached, locked).
  target = _traced.build_torch_library(_SOURCE, "benchmarks_scripted_call")
  lib = ctypes.CDLL(str(target))
  lib.tbs_bare_new.restype = ctypes.c_void_p
  lib.tbs_bare_new.argtypes = [
    ctypes.c_int64,
    ctypes.POINTER(ctypes.c_int64),
    ctypes.POINTER(ctypes.c_int64),
  ]
  _library = lib
  return lib


def unavailable():
  """Why the no-Python bridge cannot run here (a line), or None if it can.

  It needs the native op with its torch side (C++ callbacks are run by its
  CPU kernel) and builds of `scripted_call.cc` and of torchbridge's C++
  call path, which this makes (once).
  """
  if not _loader.has_torch_interop():
    return f"the native op with its torch side is not loaded ({_loader.status()})"
  try:
    library()
    _traced.library()
  except (RuntimeError, OSError, _compiler.BuildError) as err:
    return " ".join(str(err).split())[:300]
  return None


def _call_on_cpu(callback, inputs_tf, dtypes, shapes):
  # C++ callbacks run in the CPU kernel only.
  with tf.device("/CPU:0"):
    return _op.call(callback, inputs_tf, dtypes, shapes)


class _Functional(torch.nn.Module):
  """`module`'s forward with its parameters as arguments after its inputs.

  The parameters are swapped in for the traced call (as a bridge's call
  swaps them in); `module` is held unregistered, so the traced module
  keeps none of its tensors.
  """

  def __init__(self, module, n_in):
    super().__init__()
    object.__setattr__(self, "_held", module)
    by_id = {id(p): k for k, p in enumerate(module.parameters())}
    self._slots = [
      (sub._parameters, key, by_id[id(p)])  # pylint: disable=protected-access
      for sub in module.modules()
      for key, p in sub._parameters.items()  # pylint: disable=protected-access
      if p is not None
    ]
    self.n_in = n_in

  def forward(self, *args):
    params = args[self.n_in :]
    originals = [table[key] for table, key, _ in self._slots]
    for table, key, k in self._slots:
      table[key] = params[k]
    try:
      return self._held(*args[: self.n_in])
    finally:
      for (table, key, _), original in zip(self._slots, originals):
        table[key] = original


class ScriptedTorchModule(bare_native.BareNativeModule):
  """The torch module traced to TorchScript and run from the native op's
  kernel in C++: a bridge whose calls run no Python at all."""

  def __init__(self, module_torch, name="scripted_bridge"):
    super().__init__(module_torch, name, torch_outputs=True)
    self._traced = {}  # input shapes -> (module context, forward, backward)

  def _callbacks_for(self, key):
    if key not in self._traced:
      module = self._module_torch
      params = [p.detach() for p in module.parameters()]
      example = tuple(torch.zeros(s) for s in key) + tuple(params)
      with torch.no_grad():
        traced = torch.jit.trace(_Functional(module, len(key)), example, check_trace=False)
      # Tracing ran the module on this thread: its OpenMP team is released
      # again, as `_outputs_for` does (see there).
      _omp_team.release_user_team()
      traced_cpp = _traced.TracedModule(traced, torch.get_num_threads())
      self._traced[key] = (traced_cpp.forward, traced_cpp.backward, traced_cpp)
    return self._traced[key]

  def records(self, made=False):
    """Forward records alive (freed with their handles), or made so far
    (`made`), over all shapes."""
    return sum(t.records(made) for _, _, t in self._traced.values())

  @tf.autograph.experimental.do_not_convert
  def __call__(self, *inputs_tf):
    shapes, single = self._outputs_for(inputs_tf)
    forward, backward, _ = self._callbacks_for(tuple(tuple(x.shape) for x in inputs_tf))

    @tf.custom_gradient
    def call(*args_tf):  # the inputs, then the variables' values
      results = _call_on_cpu(
        forward,
        list(args_tf),
        [tf.int8] + [tf.float32] * len(shapes),
        [[1]] + list(shapes),
      )
      handle_tf, outs_tf = results[0], results[1:]

      def grad(*dys_tf):
        dys_tf = [tf.zeros(s) if d is None else d for d, s in zip(dys_tf, shapes)]
        return _call_on_cpu(
          backward,
          [handle_tf, *dys_tf],
          [a.dtype for a in args_tf],
          [a.shape for a in args_tf],
        )

      return outs_tf, grad

    outs_tf = call(*inputs_tf, *[tf.convert_to_tensor(v) for v in self.params])
    return outs_tf[0] if single else tuple(outs_tf)


class NoPythonFloorModule(bare_native.BareNativeModule):
  """The floor of a bridge with no Python per call: the ops of
  `BareNativeModule(torch_outputs=True)`, whose callback (`tbs_bare`, in
  C++) hands back fresh, uncomputed torch tensors of the outputs' shapes
  as that one's does from Python. The step built
  on it costs what the TF program and the crossings cost, no torch compute
  and no Python."""

  def __init__(self, module_torch, name="no_python_floor"):
    super().__init__(module_torch, name, torch_outputs=True)
    self._bare = {}  # output shapes -> NativeCallback

  def _bare_callback(self, shapes):
    key = tuple(tuple(int(d) for d in s) for s in shapes)
    if key not in self._bare:
      ranks = (ctypes.c_int64 * len(key))(*[len(s) for s in key])
      flat = [d for s in key for d in s]
      dims = (ctypes.c_int64 * max(1, len(flat)))(*flat)
      lib = library()
      context = lib.tbs_bare_new(len(key), ranks, dims)
      address = ctypes.cast(lib.tbs_bare, ctypes.c_void_p).value
      self._bare[key] = _callbacks.NativeCallback(address, context, owner=self)
    return self._bare[key]

  def _bare_op(self, count, inputs_tf, dtypes, out_shapes):
    del count  # fresh tensors of the declared shapes, made in C++
    return _call_on_cpu(self._bare_callback(out_shapes), inputs_tf, dtypes, out_shapes)
