"""A module's call through the bridge: the Python path.

The forward's Python runs on zero-copy torch views of the variables'
values, swapped into the module's slots (`_swap.TensorSlots`), through
`_call.call_bridged` (one op in a graph, the calling thread eagerly). A
buffer the forward may write gets a private copy, which the variable then
adopts (`TorchState.assign_writes`); the first call in a mode learns which
buffers it writes (`_write_recorder.py`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
import tensorflow as tf

from torchbridge import _call
from torchbridge._crossing import _exchange
from torchbridge._frameworks import _compat
from torchbridge._frameworks import _compiled
from torchbridge._runtime import _timeline
from torchbridge._state import _module_checks
from torchbridge._state import _write_recorder

if TYPE_CHECKING:
  from torchbridge._state import _torch_state


def call_bridged(
  state: _torch_state.TorchState,
  call: Any,
  training: bool | list[bool] | None,
  mode_key: str,
  output_signature: Any,
  after_writes: list[Any] | None,
) -> Any:
  """The call through the bridge: the forward's Python, on zero-copy
  views of the variables; the buffers it wrote assigned.

  `output_signature`: nothing is inferred while tracing, every buffer is
  written back."""
  names = state.param_names + state.buffer_names
  vars_tf = _compat.read_values([state.variables[n] for n in names])
  n_params, n_vars = len(state.param_names), len(names)

  def run(args_torch: list[torch.Tensor]) -> _call.Outputs:
    with state.lock:
      # Until the forward starts (spans only when the timeline is on: the
      # per-call path).
      bind = _timeline.span(_timeline.BIND) if _timeline.on else None
      views = state._views
      if views.lent:
        views.take_back()
      views.calls_running += 1
      if views.calls_running == 1:
        views.suspend_hooks()
      try:
        return locked_run(args_torch, bind)
      finally:
        if bind is not None:
          bind.stop()
        views.calls_running -= 1
        if not views.calls_running:
          views.resume_hooks()

  def locked_run(args_torch: list[torch.Tensor], bind: _timeline.Span | None) -> _call.Outputs:
    known_mutated = (
      frozenset(state.buffer_names)
      if output_signature is not None
      else state._mutated_buffers.get(mode_key)
    )
    buffers_torch = {}
    for n, b in zip(state.buffer_names, args_torch[n_params:n_vars]):
      if b.is_meta and b.dim() == 0:
        # Finding the output shapes on meta tensors while tracing: scalar
        # buffers (BatchNorm's num_batches_tracked, which its forward may
        # read with `.item()`) get their current value, on the CPU, where
        # torch lets 0-d tensors mix with any device.
        with tf.init_scope():
          b = _exchange.tensor_to_torch(tf.convert_to_tensor(state.variables[n])).cpu()
      # Buffers the forward may write get a private copy, so torch never
      # writes into a TF buffer behind TF's back; the copy is then
      # assigned to the variable (which adopts it without copying).
      if known_mutated is None or n in known_mutated:
        b = b.clone()
      buffers_torch[n] = b
    tensors = dict(zip(state.param_names, args_torch[:n_params]))
    tensors.update(buffers_torch)
    a, kw = call.substitute(args_torch[n_vars:])
    if bind is not None:
      bind.stop()
    saved_modes = _module_checks.set_modes(state.module, state._modules, training)
    try:
      if known_mutated is None:
        # The first call in this mode (eagerly, or on meta tensors while
        # tracing) finds the buffers the forward writes; later calls in
        # this mode copy and write back exactly those.
        versions = {n: b._version for n, b in buffers_torch.items()}
        with _compiled.run_uncompiled(), _write_recorder.WriteRecorder() as recorder:
          result, reassigned = state._slots.call(tensors, a, kw)
        known_mutated = frozenset(
          n
          for n, b in buffers_torch.items()
          if b._version != versions[n] or recorder.wrote(b) or n in reassigned
        )
      else:
        result, reassigned = state._slots.call(tensors, a, kw)
    except (RuntimeError, TypeError) as err:
      _module_checks.explain_dtype_error(err, state.name, state.module, args_torch[n_vars:])
      raise
    finally:
      if saved_modes is not None:
        _module_checks.restore_modes(saved_modes)
    # A buffer the forward replaced (`state.buf = ...`): the new tensor.
    for n, t in reassigned.items():
      if n in buffers_torch:
        buffers_torch[n] = t
    # The written buffers cross as extra outputs, to be assigned.
    return _call.Outputs(result, {n: b for n, b in buffers_torch.items() if n in known_mutated})

  # Eagerly with no tape: no gradients (as `call_bridged` narrows), no specs to find.
  differentiable = [False] * (n_vars + len(call.args_tf))
  if not (eager := tf.executing_eagerly()) or _compat.tape_could_record():
    differentiable = (
      [state.variables[n].trainable for n in state.param_names]
      + [False] * len(state.buffer_names)
      + [_call.is_differentiable(a.dtype) for a in call.args_tf]
    )
  extra_signature = None
  if output_signature is not None:
    extra_signature = {
      n: tf.TensorSpec(state.variables[n].shape, state.variables[n].dtype)
      for n in state.buffer_names
    }
  # Output specs found by a real run while tracing use the current weights.
  stand_ins = None if eager else [functools.partial(state.current_value, n) for n in names]
  outputs = _call.call_bridged(
    run,
    vars_tf + call.args_tf,
    state.name,
    output_signature=output_signature,
    differentiable=differentiable,
    extra_signature=extra_signature,
    stand_ins=None if stand_ins is None else stand_ins + [None] * len(call.args_tf),
  )
  state.assign_writes(outputs.extra, mode_key, after_writes)
  return outputs.result
