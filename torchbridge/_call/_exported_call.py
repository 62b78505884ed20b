"""A graph call run from C++: the forward and backward ops of a
`_native._exported_program.ExportedProgram`, with TF's gradient.

The forward op returns a one-byte handle besides the outputs; the handle
owns the forward's autograd record in C++ and is what the backward op
takes, with the upstream gradients. Gradients reach the arguments marked
differentiable; a second-order gradient (differentiating the backward)
gets an error that names the fix when it is traced, since the C++ backward
builds no graph of its own. A tape that merely could record the backward
(one outside the tf.function) is fine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._call import _call_bridged
from torchbridge._call import _xla_shapes
from torchbridge._frameworks import _compat
from torchbridge._native import _op


def call_exported(
  program: Any,  # a `_native._exported_program.ExportedProgram`
  args_tf: Sequence[tf.Tensor],
  out_specs: Sequence[tf.TensorSpec],
  differentiable: Sequence[bool],
  name: str,
) -> list[tf.Tensor]:
  """The program on `args_tf` as one differentiable TF op (eagerly, or in
  a graph).

  Args:
    program: the exported program and its two C++ callbacks.
    args_tf: flat list of TF tensors, the program's arguments.
    out_specs: its outputs' `tf.TensorSpec`s (None for a dimension that
      follows one TF leaves unknown).
    differentiable: one bool per argument: which get gradients.
    name: the call's name, for errors and (cleaned) the ops' names.
  """
  op_name = _call_bridged._op_name(name)
  # Under XLA the handle is an int64 id (the copy into XLA's buffer would
  # free a handle that owns the record), counted down by the backwards
  # traced for it.
  xla = _compat.in_xla_context()
  forward, backward, backwards = program.forward, program.backward, [0]
  # Under XLA, output shapes unknown when traced are found when XLA
  # compiles the op: the exported graph on meta tensors (`_xla_shapes`).
  forward_shapes = None
  if xla:
    forward, set_backwards = program.forward_xla(_compat.tape_could_record())
    backward = program.backward_xla
    if not _xla_shapes.all_known([s.shape for s in out_specs]):
      run_graph = _xla_shapes.exported_graph_runner(program)
      forward_shapes = _xla_shapes.forward_shapes(run_graph, name, 1)

  @tf.custom_gradient
  def bridged(*args: tf.Tensor) -> tuple[list[tf.Tensor], Any]:
    with tf.device("/CPU:0"):  # C++ callbacks run in the CPU kernel
      results = _op.call(
        forward,
        list(args),
        [tf.int64 if xla else tf.int8] + [s.dtype for s in out_specs],
        [[1]] + [s.shape for s in out_specs],
        name=op_name,
        output_shapes=forward_shapes,
      )
    handle_tf, outs_tf = results[0], results[1:]

    def grad(*dys_tf: tf.Tensor | None) -> list[tf.Tensor | None]:
      dys = [tf.zeros_like(out) if dy is None else dy for dy, out in zip(dys_tf, outs_tf)]
      if xla:
        backwards[0] += 1
        set_backwards(backwards[0])

      # A tape may record this backward (one outside the tf.function makes
      # TF trace it under a tape, in case); only a second-order gradient
      # actually taken is refused, when it is traced. The forward's
      # arguments are inputs too, unused, so that one reaches it (the
      # handle is an integer: no gradient flows through it).
      n_backward = 1 + len(dys)

      @tf.custom_gradient
      def backward_op(*inputs: tf.Tensor) -> tuple[list[tf.Tensor], Any]:
        # Under XLA, gradients of shapes unknown when traced: empty tensors
        # carry the arguments' shapes to the op, for XLA's compiler.
        carriers, grad_shapes = [], None
        if xla and not _xla_shapes.all_known([a.shape for a in args]):
          carriers = _xla_shapes.carriers(inputs[n_backward:])
          grad_shapes = _xla_shapes.carried_shapes(name, 0)
        with tf.device("/CPU:0"):
          grads = _op.call(
            backward,
            list(inputs[:n_backward]) + carriers,
            [a.dtype for a in args],
            [a.shape for a in args],
            name=op_name + "_grad",
            output_shapes=grad_shapes,
          )

        def second_order(*unused: tf.Tensor | None) -> list[tf.Tensor | None]:
          raise NotImplementedError(_SECOND_ORDER.format(name=name))

        return grads, second_order

      grads = _compat.gradient_dies_with_graph(list(backward_op(handle_tf, *dys, *args)))
      # Arguments that get no gradient: None, so TF never asks the op for
      # theirs (the kernel computes only the gradients TF consumes).
      return [g if diff else None for g, diff in zip(grads, differentiable)]

    return outs_tf, grad

  return _compat.gradient_dies_with_graph(list(bridged(*args_tf)))


_SECOND_ORDER = (
  "{name}: a second-order gradient (a tape recording this backward) "
  "through the C++ torch runner: its backward runs in C++ and builds "
  "no graph to differentiate. Set TORCHBRIDGE_TORCH_RUNNER=python "
  "before the tf.function is traced (the Python path gives every "
  'order), or construct the module with run="auto" where it '
  "translates (TF's own gradients)."
)
