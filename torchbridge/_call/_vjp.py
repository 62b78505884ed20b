"""Vector-Jacobian products on a recorded torch graph, with little overhead.

`torch.autograd.grad` validates its arguments in Python (tensor-likes,
shapes of the upstream gradients, symbolic sizes) before it calls the C++
autograd engine; for the small graphs of a bridged call that costs more than
the backward itself (~25-30 us per call on a 2-core CPU, measured with torch
2.13). The bridge's upstream gradients come from TF, which already makes
them match the outputs in dtype and shape, so `vjp` checks only that cheaply
and calls the engine as `torch.autograd.grad` does. Anything unusual (tensor
subclasses with `__torch_function__`, a mismatch, a torch without the
engine entry point) goes through `torch.autograd.grad` itself, so the
results and errors are always torch's own.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

import torch
from torch.overrides import has_torch_function

from torchbridge._frameworks import _compat

# torch's C++ autograd engine, as torch.autograd.grad reaches it, and the
# functions with which torch.autograd.grad stashes the Python context for the
# engine's device threads (compiled autograd reads its configuration there);
# vjp does the same. Optional (see _compat).
_ENGINE = _compat.autograd_engine
_STASH = _compat.stash_obj_in_tls
_UNSTASH = _compat.remove_obj_from_tls


def vjp(
  outputs: Sequence[torch.Tensor],
  inputs: Sequence[torch.Tensor],
  grad_outputs: Sequence[torch.Tensor],
  create_graph: bool,
) -> tuple[torch.Tensor, ...]:
  """`torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True,
  create_graph=create_graph, allow_unused=True, materialize_grads=True)`.

  Args:
    outputs: list of torch tensors of a recorded graph.
    inputs: list of torch tensors (leaves) to differentiate against.
    grad_outputs: one upstream gradient per output, of its dtype and shape.
    create_graph: whether to record the backward itself.

  Returns:
    Tuple of gradients, one per input (zeros where an input is unused).

  Examples:
    >>> import torch
    >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
    >>> unused = torch.ones(3, requires_grad=True)
    >>> vjp([x * x], [x, unused], [torch.ones(2)], create_graph=False)
    (tensor([2., 4.]), tensor([0., 0., 0.]))
  """
  outputs, inputs = tuple(outputs), tuple(inputs)
  grad_outputs = tuple(grad_outputs)
  engine = _ENGINE
  if engine is None or not _fast_path_applies(outputs, inputs, grad_outputs):
    return torch.autograd.grad(
      outputs,
      inputs,
      grad_outputs,
      retain_graph=True,
      create_graph=create_graph,
      allow_unused=True,
      materialize_grads=True,
    )
  stash, unstash = _STASH, _UNSTASH
  if stash is None or unstash is None:
    grads = engine.run_backward(outputs, grad_outputs, True, create_graph, inputs, True, False)
  else:
    stash("context", contextvars.copy_context())
    try:
      grads = engine.run_backward(outputs, grad_outputs, True, create_graph, inputs, True, False)
    finally:
      unstash("context")
  for g in grads:  # a loop, not a generator: one frame less per call
    if g is None:
      break
  else:
    return tuple(grads)
  return tuple(
    g if g is not None else torch.zeros_like(x, requires_grad=create_graph)
    for g, x in zip(grads, inputs)
  )


def _fast_path_applies(
  outputs: tuple[torch.Tensor, ...],
  inputs: tuple[torch.Tensor, ...],
  grad_outputs: tuple[torch.Tensor, ...],
) -> bool:
  if len(outputs) != len(grad_outputs):
    return False
  if has_torch_function(outputs) or has_torch_function(inputs) or has_torch_function(grad_outputs):
    return False
  for out, dy in zip(outputs, grad_outputs):
    if (
      type(dy) is not torch.Tensor  # pylint: disable=unidiomatic-typecheck
      or dy.dtype != out.dtype
      or dy.shape != out.shape
      or dy.device != out.device
      or dy.is_nested
      or out.is_nested
    ):
      return False
  return True
