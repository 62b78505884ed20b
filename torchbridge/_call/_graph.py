"""A bridged call inside a graph: one stateful op that returns a handle too.

The op is the native `TorchbridgeCall` op of csrc/, or a `tf.py_function`.
Besides the outputs it returns a one-byte handle tensor: a DLPack view of a
torch tensor that owns the call's `_saved.Saved` record. TF keeps the handle
exactly as long as a gradient may still need it (not at all in an inference
call, until the backward in a training call) and then frees it, which frees
the record. The native op also tells the callback whether anything in the
running graph consumes the handle; when nothing does (an inference call), no
autograd graph is recorded and no handle is made at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._call import _gradients
from torchbridge._call import _output_check
from torchbridge._call import _protocol
from torchbridge._call import _saved
from torchbridge._call import _signature
from torchbridge._call import _xla_shapes
from torchbridge._crossing import _exchange
from torchbridge._frameworks import _compat
from torchbridge._native import _loader
from torchbridge._native import _op
from torchbridge._runtime import _placement
from torchbridge._runtime import _thread_state
from torchbridge._runtime import _timeline


def call_graph(
  forward: _protocol.Forward,
  grad_args_tf: Sequence[tf.Tensor],
  py_args_tf: Sequence[tf.Tensor],
  out_specs: Sequence[tf.TensorSpec],
  record: bool,
  name: str,
  differentiable: Sequence[bool],
  specs_found: str = _signature.DECLARED,
  output_shapes: _xla_shapes.OutputShapes | None = None,
) -> list[tf.Tensor]:
  """`forward` inside a graph, as one stateful op returning a handle too.

  `grad_args_tf` are the tensors TF differentiates against; `py_args_tf` the
  tensors the Python body receives (for a backward: the handle of the
  forward and the upstream gradients, not the forward's arguments, which
  live on in its `_saved.Saved` record; under XLA, with shapes to find,
  then empty tensors that carry their shapes). `output_shapes`: the op's
  output shapes when XLA compiles it (default: `forward` on meta tensors).
  """

  check_outputs = _output_check.OutputCheck(out_specs, name, specs_found)
  # Under XLA (jit_compile=True) the op becomes an XLA custom call
  # (csrc/xla/): output shapes unknown when traced are found when XLA
  # compiles it (`_xla_shapes`), outputs are copied into XLA's buffers, and
  # the handle is an id (`_saved.own_id`). Nothing says which outputs the
  # compiled program consumes: a call no tape records when it is traced
  # keeps no record.
  xla = _compat.in_xla_context()
  xla_inference = xla and not (record and _compat.tape_could_record())
  if xla:
    output_shapes = _xla_shapes.of_call(name, forward, py_args_tf, out_specs, output_shapes)
  backwards = [0]  # backward calls traced for this call (XLA's handle uses)

  def run(
    py_args_torch: list[torch.Tensor], unused: Collection[int] | None = None
  ) -> list[torch.Tensor | None]:
    # The tf.py_function path: handed to the torch thread from here.
    with _timeline.span(_timeline.HAND_OFF):
      return _placement.run_graph_call(run_here, py_args_torch, unused)

  def run_native(
    py_args_torch: list[torch.Tensor], unused: Collection[int] | None = None
  ) -> list[torch.Tensor | None]:
    # On the native op's torch thread already (CPU), or on TF's thread with
    # TF's CUDA stream as torch's (GPU: no OpenMP teams there).
    _placement.prepare_native_call()
    return run_here(py_args_torch, unused)

  def run_here(
    py_args_torch: list[torch.Tensor], unused: Collection[int] | None = None
  ) -> list[torch.Tensor | None]:
    # `unused`: the outputs nothing in the running graph consumes (None: not
    # known). In an inference call nothing consumes the handle (output 0):
    # then no autograd graph is recorded and no handle is made.
    # (The per-call path: the timeline's spans only when it is on; each
    # Python frame here costs several times more on the cold caches a call
    # meets inside a step; docs/performance/timeline.md, "Per call".)
    call = _timeline.span(_timeline.CALL) if _timeline.on else None
    phase: _timeline.Span | None = None
    try:
      # Under XLA a call whose backward was not traced by the time it runs
      # never gets one (TF traces a compiled function's gradients before
      # running it): it keeps no record.
      inference = (unused is not None and 0 in unused) or xla_inference
      inference = inference or (xla and not backwards[0])
      grad_mode = torch.is_grad_enabled()
      _compat.set_grad_enabled(record and not inference)
      try:
        if inference:
          saved = None
          outs_torch = forward(py_args_torch, record=False, unused=unused).outs_torch
        else:
          saved = forward(py_args_torch, record=record)
          outs_torch = saved.outs_torch
      finally:
        _compat.set_grad_enabled(grad_mode)
      phase = _timeline.span(_timeline.CHECK) if call else None
      check_outputs(outs_torch)
      if saved is None:
        return [_NO_RECORD if xla else None, *outs_torch]
      if xla:
        return [_saved.own_id(saved, backwards[0]), *outs_torch]
      if phase:
        phase.stop()
        phase = _timeline.span(_timeline.SAVE)
      handle_torch = torch.empty(1, dtype=torch.int8, device=_handle_device(outs_torch))
      _saved.own(handle_torch, saved)
      return [handle_torch, *outs_torch]
    finally:
      if call:
        if phase:
          phase.stop()
        call.stop()

  @tf.custom_gradient
  def bridged(*grad_args: tf.Tensor) -> tuple[list[tf.Tensor], Any]:
    results = _stateful_op(
      run,
      run_native,
      py_args_tf,
      [tf.int64 if xla else tf.int8] + [s.dtype for s in out_specs],
      [[1]] + [s.shape for s in out_specs],
      name,
      output_shapes if xla else None,
    )
    handle_tf, outs_tf = results[0], results[1:]
    if xla:
      _check_xla_device(name, handle_tf.op.device)

    def grad(*dys_tf: tf.Tensor | None) -> list[tf.Tensor | None]:
      backwards[0] += 1
      sel_out, diff_args = _gradients.grad_positions(out_specs, differentiable, dys_tf)

      def backward(
        py_args_torch: list[torch.Tensor],
        *,
        record: bool,
        unused: Collection[int] | None = None,
      ) -> _saved.Saved:  # a `Forward`
        saved = _saved.lookup(py_args_torch[0])
        # Output k + 1 of this op is the gradient of argument diff_args[k];
        # the native op says which ones nothing consumes (e.g. those of
        # inputs no tape watches): those are not computed, unless a
        # higher-order gradient will differentiate this backward (it then
        # consumes the handle, output 0, and `unused` is not passed), which
        # reaches them through torch's graph rather than through TF's edges.
        skip = [k - 1 for k in unused or () if k > 0]
        dys_torch = py_args_torch[1 : 1 + len(sel_out)]  # then any carriers
        return _saved.backward(saved, sel_out, diff_args, dys_torch, record, skip)

      dys_sel_tf = [dys_tf[i] for i in sel_out]
      # The backward may be traced in another graph than the forward (the
      # backward function of a tf.function); identities capture the
      # forward's tensors there, so that a gradient of this backward, traced
      # in yet another graph, refers to tensors of its parent graph only.
      xs_tf = [_in_current_graph(grad_args[j]) for j in diff_args]
      grad_specs = [tf.TensorSpec(x.shape, x.dtype) for x in xs_tf]
      # Under XLA, gradients of shapes unknown when traced: empty tensors
      # carry the arguments' shapes to the op, for XLA's compiler.
      carriers, grad_shapes = [], None
      if xla and not _xla_shapes.all_known([s.shape for s in grad_specs]):
        carriers, grad_shapes = _xla_shapes.carriers(xs_tf), _xla_shapes.carried_shapes(name, 1)
      grads_tf = call_graph(
        backward,
        dys_sel_tf + xs_tf,
        [_in_current_graph(handle_tf)] + dys_sel_tf + carriers,
        grad_specs,
        # Build the double-backward graph only when a tape records this
        # backward; otherwise a later request recomputes it (regraph).
        _compat.tape_could_record(),
        name + "_grad",
        [True] * (len(sel_out) + len(diff_args)),
        output_shapes=grad_shapes,
      )
      return _gradients.scatter(grads_tf, diff_args, len(grad_args))

    return outs_tf, grad

  return _compat.gradient_dies_with_graph(list(bridged(*grad_args_tf)))


def _stateful_op(
  run: Callable[[list[torch.Tensor]], Sequence[torch.Tensor | None]],
  run_native: Callable[..., Sequence[torch.Tensor | None]],
  inputs_tf: Sequence[tf.Tensor],
  out_dtypes: Sequence[tf.DType],
  out_shapes: Sequence[Any],
  name: str,
  output_shapes: _xla_shapes.OutputShapes | None = None,
) -> list[tf.Tensor]:
  """One stateful graph op running `run(list of torch views) -> tensors`.

  The native op of `csrc/` when it is available (it hands torch tensors to
  `run_native` directly, on its torch thread); otherwise a
  `tf.py_function`, whose body receives eager tensors and returns eager
  tensors, both through DLPack, and calls `run`.
  """
  if _loader.available():
    # Output 0 is the handle, whose Python object owns the `_saved.Saved`
    # record.
    return _op.call(
      run_native,
      inputs_tf,
      out_dtypes,
      out_shapes,
      name=name,
      torch_tensors=True,
      whole_tensor_outputs=[0],
      output_shapes=output_shapes,
    )

  def body(*inputs_eager: tf.Tensor) -> list[tf.Tensor]:
    _thread_state.keep_for_this_thread()
    with _timeline.span(_timeline.TO_TORCH):
      inputs_torch = _views(inputs_eager)
    # No output is None here: only the native op passes `unused`.
    outs_torch = cast("list[torch.Tensor]", run(inputs_torch))
    with _timeline.span(_timeline.TO_TF):
      handle_torch, *results_torch = outs_torch
      return [_exchange.handle_to_tf(handle_torch)] + [
        _exchange.tensor_to_tf(o) for o in results_torch
      ]

  # TF holds a graph's py_function bodies for the process: the graph, this one.
  graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  function = body if graph is None else _compat.held_by_graph(body, graph)
  outs_tf = tf.py_function(function, inputs_tf, Tout=out_dtypes, name=name)
  for out_tf, shape in zip(outs_tf, out_shapes):
    out_tf.set_shape(shape)
  return outs_tf


# The handle of a call under XLA that keeps no record.
_NO_RECORD = torch.zeros(1, dtype=torch.int64)


_XLA_GPU = """\
{name} would run under XLA (jit_compile=True) on {device}: torchbridge's XLA
custom call runs on the CPU only (no XLA GPU kernel). Run the compiled
function on the CPU (`with tf.device("/CPU:0"): step(...)`), compile it
without XLA (jit_compile=False: the native op runs torch on the GPU), or let
the module run as its TF translation (run="auto" or "tf"), which XLA
compiles on any device."""


def _check_xla_device(name: str, op_device: str) -> None:
  """Raises, naming the fix, where a call under XLA would be placed on a
  GPU (TF's own error, a missing XLA_GPU_JIT kernel, names neither).

  Decided when the call is traced, from the op's device scope, else the
  eager caller's, else whether TF sees a GPU (where TF places a compiled
  function with no scope)."""
  device = tf.DeviceSpec.from_string(op_device or _compat.eager_device_name())
  kind = device.device_type
  if not kind and tf.config.list_physical_devices("GPU"):
    kind = "GPU"
  if kind and kind.upper() != "CPU":
    raise NotImplementedError(_XLA_GPU.format(name=name, device=op_device or kind))


def _views(tensors_tf: Sequence[tf.Tensor]) -> list[torch.Tensor]:
  return [_exchange.tensor_to_torch(t) for t in tensors_tf]


def _handle_device(outs_torch: Sequence[torch.Tensor | None]) -> torch.device | str:
  """Where the handle lives: on the op's device, so TF never moves it."""
  gpu = _placement.current_gpu()
  if gpu is not None:
    return torch.device("cuda", gpu)
  for out in outs_torch:
    if out is not None and out.is_cuda:
      return out.device
  return "cpu"


def _in_current_graph(tensor_tf: tf.Tensor) -> tf.Tensor:
  if tensor_tf.graph is tf.compat.v1.get_default_graph():
    return tensor_tf
  return tf.identity(tensor_tf)  # captures it into this graph
