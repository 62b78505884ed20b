"""A bridge with no Python per call: the floor of "the module's Python off
the call path", measured.

`ScriptedTorchModule` stands where a `tb.TorchModule` stood, as
`bare_native.LeanTorchModule` does, on the same native op and variables,
but its calls never enter Python: the torch module is captured once
(`torch.export`, its parameters lifted to inputs, as TF hands them to each
call) and each forward and backward op runs the captured ATen graph from
C++ (torchbridge's C++ torch runner, csrc/exported/, through the ops' C++
callbacks, `csrc/native_callback.h`): no GIL, no Python frame, no
parameter swap, one dispatcher call per ATen node and autograd run in
C++. It is the C++ torch runner with none of the wrapper around it
(binding, modes, checks, watches, the fallbacks). Its floor,
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
from torchbridge._native import _exported
from torchbridge._native import _exported_program
from torchbridge._runtime import _omp_team

_SOURCE = Path(__file__).resolve().parent / "csrc" / "scripted_call.cc"
_library = None


def library():
  """The floor's C++ callback library, built on first use and cached."""
  global _library
  if _library is not None:
    return _library
  # Built as torchbridge builds its own torch-side library (cached, locked).
  target = _exported.build_torch_library(_SOURCE, "benchmarks_scripted_call")
  lib = ctypes.CDLL(str(target))
  lib.tbs_bare_new.restype = ctypes.c_void_p
  lib.tbs_bare_new.argtypes = [
    ctypes.c_int64,
    ctypes.POINTER(ctypes.c_int64),
    ctypes.POINTER(ctypes.c_int64),
  ]
  lib.tbs_bare_busy.restype = ctypes.c_int64
  lib.tbs_bare_busy.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64]
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
    _exported.library()
  except (RuntimeError, OSError, _compiler.BuildError) as err:
    return " ".join(str(err).split())[:300]
  return None


def _call_on_cpu(callback, inputs_tf, dtypes, shapes):
  # C++ callbacks run in the CPU kernel only.
  with tf.device("/CPU:0"):
    return _op.call(callback, inputs_tf, dtypes, shapes)


class ScriptedTorchModule(bare_native.BareNativeModule):
  """The torch module captured with `torch.export` and run from the native
  op's kernel in C++: a bridge whose calls run no Python at all."""

  def __init__(self, module_torch, name="scripted_bridge"):
    super().__init__(module_torch, name, torch_outputs=True)
    self._programs = {}  # input shapes -> (forward, backward, program)

  def _callbacks_for(self, key):
    if key not in self._programs:
      module = self._module_torch
      example = tuple(torch.zeros(s) for s in key)
      exported = torch.export.export(module, example).run_decompositions({})
      # The op passes the inputs, then the parameters in module order.
      position = {n: len(key) + k for k, (n, _) in enumerate(module.named_parameters())}
      names = [None] * (len(key) + len(position))
      user = 0
      for spec in exported.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.PARAMETER:
          names[position[spec.target]] = spec.arg.name
        else:
          names[user] = spec.arg.name
          user += 1
      # Exporting ran the module on this thread: its OpenMP team is
      # released again, as `_outputs_for` does (see there).
      _omp_team.release_user_team()
      program = _exported_program.ExportedProgram(
        exported.graph, names, 0, [True] * len(names), torch.get_num_threads()
      )
      self._programs[key] = (program.forward, program.backward, program)
    return self._programs[key]

  def records(self, made=False):
    """Forward records alive (freed with their handles), or made so far
    (`made`), over all shapes."""
    return sum(t.records(made) for _, _, t in self._programs.values())

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
  and no Python.

  `busy(ns, kind)` makes each later callback work `ns` before it returns,
  on the torch thread as torch's work would: it spins on the clock alone
  (`SPIN`: a long op, nothing else), writes over 4 MiB of memory
  (`MEMORY`: a long op that evicts the caches' lines), or runs torch
  matmuls of 128 x 128 on torch's threads (`TORCH_MATMULS`: torch's own
  work, its OpenMP team included)."""

  SPIN, MEMORY, TORCH_MATMULS = 0, 1, 2
  MEMORY_BYTES = 4 << 20

  def __init__(self, module_torch, name="no_python_floor"):
    super().__init__(module_torch, name, torch_outputs=True)
    self._bare = {}  # output shapes -> NativeCallback
    self._contexts = []  # their `tbs_bare` contexts
    self._busy = (0, self.SPIN)

  def busy(self, ns, kind=SPIN):
    """Makes each later call's callback work `ns` nanoseconds as `kind`
    says (0: none); returns how many callbacks have run so far."""
    self._busy = (int(ns), int(kind))
    return sum(self._set_busy(context) for context in self._contexts)

  def _set_busy(self, context):
    ns, kind = self._busy
    size = self.MEMORY_BYTES if kind == self.MEMORY else 0
    return int(library().tbs_bare_busy(context, ns, kind, size))

  def _bare_callback(self, shapes):
    key = tuple(tuple(int(d) for d in s) for s in shapes)
    if key not in self._bare:
      ranks = (ctypes.c_int64 * len(key))(*[len(s) for s in key])
      flat = [d for s in key for d in s]
      dims = (ctypes.c_int64 * max(1, len(flat)))(*flat)
      lib = library()
      context = lib.tbs_bare_new(len(key), ranks, dims)
      self._contexts.append(context)
      self._set_busy(context)
      address = ctypes.cast(lib.tbs_bare, ctypes.c_void_p).value
      self._bare[key] = _callbacks.NativeCallback(address, context, owner=self)
    return self._bare[key]

  def _bare_op(self, count, inputs_tf, dtypes, out_shapes):
    del count  # fresh tensors of the declared shapes, made in C++
    return _call_on_cpu(self._bare_callback(out_shapes), inputs_tf, dtypes, out_shapes)


class TorchLinearFloorModule(NoPythonFloorModule):
  """`NoPythonFloorModule` with torch's own work of its one `Linear` put
  back: the forward op's C++ callback (`tbs_linear`) runs `at::linear` on
  the op's input and parameters, no autograd recording, and hands the
  result to TF. What any bridge that runs the module's torch in the call
  pays at the least: torch's work where it runs, between TF's (its code
  and data no longer in the core's caches, unlike torch's own loop). The
  backward op stays the floor's (fresh tensors). A `Linear` only.
  `boxed=True` calls `aten::linear` through the dispatcher's boxed call
  (`tbs_linear_boxed`: an IValue stack, as a runner interpreting an
  exported graph node by node calls each op)."""

  def __init__(self, module_torch, name="torch_linear_floor", boxed=False):
    if not isinstance(module_torch, torch.nn.Linear):
      raise TypeError(f"TorchLinearFloorModule runs a torch.nn.Linear, got {module_torch!r}")
    super().__init__(module_torch, name)
    callback = library().tbs_linear_boxed if boxed else library().tbs_linear
    address = ctypes.cast(callback, ctypes.c_void_p).value
    self._linear = _callbacks.NativeCallback(address, None, owner=self)

  def _bare_op(self, count, inputs_tf, dtypes, out_shapes):
    if len(out_shapes) == 1 and count == 1:  # the forward: (zeros, x, weight, bias)
      return _call_on_cpu(self._linear, inputs_tf, dtypes, out_shapes)
    return super()._bare_op(count, inputs_tf, dtypes, out_shapes)
