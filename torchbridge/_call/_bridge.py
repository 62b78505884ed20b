"""The differentiable call from TF into torch, to any order of derivative.

General strategy:
1. A bridged call runs a torch computation on zero-copy views of its TF
   arguments. Its floating arguments become torch leaves that require grad,
   so torch records the autograd graph while computing the outputs.
2. The outputs go back to TF zero-copy. The torch outputs, leaves and graph
   are kept in a `_saved.Saved` record for the backward, which never re-runs
   the forward: it computes a vector-Jacobian product on the saved graph
   (`_saved.backward`).
3. The backward is itself a bridged call (its arguments: the upstream
   gradients and the forward's floating arguments; its torch leaves: fresh
   leaves for the upstream gradients and the forward's own leaves), so nested
   `GradientTape`s compose to any order.
4. Eagerly (`_eager`), the record lives in the gradient function's closure.
   Inside `tf.function` (`_graph`), the call is one stateful op that also
   returns a handle owning the record, freed when no gradient can need it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._call import _eager
from torchbridge._call import _gradients
from torchbridge._call import _graph
from torchbridge._call import _protocol
from torchbridge._call import _signature
from torchbridge._runtime import _placement


def call(
  forward: _protocol.Forward,
  args_tf: Sequence[tf.Tensor],
  out_specs: Sequence[tf.TensorSpec] | None = None,
  *,
  name: str = "torch_call",
  differentiable: Sequence[bool] | None = None,
  specs_found: str = _signature.DECLARED,
) -> list[tf.Tensor | None]:
  """Runs `forward` as one differentiable TF op on `args_tf`.

  Args:
    forward: the torch computation (`_protocol.Forward`).
    args_tf: flat list of TF tensors.
    out_specs: flat list of `tf.TensorSpec` of the outputs, required when
      tracing a `tf.function`.
    name: name of the op in TF graphs.
    differentiable: optional list of bools, one per argument: which ones get
      gradients. Defaults to the floating ones.
    specs_found: how `out_specs` were found, for the error of a call whose
      outputs do not match them.

  Returns:
    Flat list of TF tensors.
  """
  if differentiable is None:
    differentiable = [_gradients.is_differentiable(a.dtype) for a in args_tf]
  _placement.remember_user_threads()  # on the user's thread
  if tf.executing_eagerly():
    return _eager.call_eager(forward, args_tf, differentiable)
  _placement.graph_call_traced()
  assert out_specs is not None  # a graph's op declares its outputs: callers pass them
  return _graph.call_graph(
    forward, args_tf, args_tf, out_specs, True, name, differentiable, specs_found
  )
