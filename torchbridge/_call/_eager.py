"""An eager bridged call: on the calling thread, no op, no handle.

The `_saved.Saved` record lives in the closure of the gradient function that
`tf.custom_gradient` hands to the tape, and dies with the tape. When no tape
is recording, no graph is built at all.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._call import _gradients
from torchbridge._call import _protocol
from torchbridge._call import _saved
from torchbridge._crossing import _exchange
from torchbridge._frameworks import _compat
from torchbridge._runtime import _placement
from torchbridge._runtime import _timeline


def call_eager(
  forward: _protocol.Forward,
  args_tf: Sequence[tf.Tensor],
  differentiable: Sequence[bool],
  n_used: int | None = None,
) -> list[tf.Tensor | None]:
  """Eagerly: `forward` sees torch views of the first `n_used` arguments."""
  if n_used is None:
    n_used = len(args_tf)
  # On the calling thread, the user's own: no hand-over (see
  # docs/guides/threads.md: one costs 40-90 us here, more than an
  # eager call).
  if not (_compat.tape_could_record() and any(differentiable)):
    with torch.no_grad(), _timeline.span(_timeline.CALL):
      saved = forward(_views(args_tf[:n_used]), record=False)
    outs_tf = [_to_tf_or_none(o) for o in saved.outs_torch]
    _placement.eager_call_done()
    return outs_tf

  @tf.custom_gradient
  def bridged(*args: tf.Tensor) -> tuple[list[tf.Tensor | None], Any]:
    with torch.enable_grad(), _timeline.span(_timeline.CALL):
      saved = forward(_views(args[:n_used]), record=True)
    outs_tf = [_to_tf_or_none(o) for o in saved.outs_torch]

    def grad(*dys_tf: tf.Tensor | None) -> list[tf.Tensor | None]:
      # Gradients are themselves bridged calls, so an outer tape that
      # records this backward can differentiate it again.
      # A recorded forward's outputs are tensors (a None comes only from a
      # backward's none_ok gradients), as before these hints: not narrowed.
      specs = [tf.TensorSpec(o.shape, o.dtype) for o in outs_tf]  # type: ignore[union-attr]
      sel_out, diff_args = _gradients.grad_positions(specs, differentiable, dys_tf)

      # Its arguments: the upstream gradients, which torch reads, and the
      # forward's arguments, which only connect the tape (their torch leaves
      # live in `saved`).
      def backward(
        dys_torch: list[torch.Tensor], *, record: bool, unused: Collection[int] | None = None
      ) -> _saved.Saved:  # a `Forward` too
        del unused
        return _saved.backward(saved, sel_out, diff_args, dys_torch, record, none_ok=True)

      grads_tf = call_eager(  # releases the team as the forward did
        backward,
        [dys_tf[i] for i in sel_out] + [args[j] for j in diff_args],
        [True] * (len(sel_out) + len(diff_args)),
        n_used=len(sel_out),
      )
      return _gradients.scatter(grads_tf, diff_args, len(args))

    return outs_tf, grad

  outs_tf = list(bridged(*args_tf))
  _placement.eager_call_done()
  return outs_tf


def _to_tf_or_none(out_torch: torch.Tensor | None) -> tf.Tensor | None:
  # None: a gradient torch cannot give (see _saved.backward).
  return None if out_torch is None else _exchange.tensor_to_tf(out_torch)


def _views(tensors_tf: Sequence[tf.Tensor]) -> list[torch.Tensor]:
  return [_exchange.tensor_to_torch(t) for t in tensors_tf]
