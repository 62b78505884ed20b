"""`call_bridged`: a wrapper's torch computation as the core's `Forward`.

The one adapter every wrapper goes through: it runs the wrapper's
`run(args_torch) -> result`, flattens the result (what may cross, where the
tensors sit, the extra outputs), makes the torch leaves for a recorded call
(and learns which arguments torch refuses to differentiate), checks the
arguments were not written, finds the output specs while tracing and packs
the TF outputs back into the result's structure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._call import _bridge
from torchbridge._call import _gradients
from torchbridge._call import _saved
from torchbridge._call import _signature
from torchbridge._call._protocol import Outputs
from torchbridge._frameworks import _compat


@tf.autograph.experimental.do_not_convert
def call_bridged(
  run: Callable[[list[torch.Tensor]], Any],
  args_tf: Sequence[tf.Tensor],
  name: str,
  output_signature: Any = None,
  differentiable: Sequence[bool] | None = None,
  extra_signature: Mapping[str, tf.TensorSpec] | None = None,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None = None,
) -> Any:
  """Calls `run(args_torch) -> result` through the bridge, as a `Forward`.

  Args:
    run: the torch computation, given torch views of `args_tf`; returns a
      nest of torch tensors (numbers and None allowed), or an `Outputs`.
    args_tf: flat list of TF tensors.
    name: for errors and graph op names.
    output_signature: optional nest of `tf.TensorSpec` of run's result.
    differentiable: optional list of bools, one per argument of `args_tf`:
      which may get gradients (default: the floating ones). Of those, only
      the ones a gradient can be asked for become torch leaves: eagerly, the
      arguments a tape watches; in a graph, those not under
      `tf.stop_gradient`.
    extra_signature: with `output_signature`, the `tf.TensorSpec`s of the
      `Outputs.extra` that `run` returns, by name.
    stand_ins: optional list, one per argument: None, or a callable giving
      the torch tensor to use for it if the output specs must be found by
      running `run` for real while tracing (see `_signature`).

  Returns:
    The result of `run` as a nest of TF tensors (None leaves stay None), or,
      when `run` returns an `Outputs`, an `Outputs` of TF tensors.
  """
  layout: dict[str, Any] = {}  # set by the first run: where the tensors sit in the result

  def flat_outputs(args_torch: list[torch.Tensor]) -> list[torch.Tensor]:
    result = run(args_torch)
    extra = None
    if isinstance(result, Outputs):
      result, extra = result.result, result.extra
    if layout.get("single") and isinstance(result, torch.Tensor):
      outs_torch = [result]  # the common result, after the first call
    elif type(result) is tuple and len(result) == layout.get("tuple_size"):
      # The next most common, a flat tuple of tensors (no tf.nest).
      outs_torch = list(result)
      for out in outs_torch:
        if type(out) is not torch.Tensor:  # pylint: disable=unidiomatic-typecheck
          outs_torch = _flatten_result(result, name, layout)
          break
    else:
      outs_torch = _flatten_result(result, name, layout)
    names = layout.setdefault("extra_names", None if extra is None else list(extra))
    if extra is not None:
      if list(extra) != names:
        raise RuntimeError(
          f"{name}: the forward's extra outputs changed from {names} to "
          f"{list(extra)} between runs of one traced call; this is a bug "
          "in torchbridge, please report it."
        )
      outs_torch = outs_torch + list(extra.values())
    return outs_torch

  if differentiable is None:
    differentiable = [_gradients.is_differentiable(a.dtype) for a in args_tf]
  differentiable = _gradients.can_get_gradients(args_tf, differentiable)

  no_leaves = [None] * len(args_tf)

  # Positions of arguments torch refused to record a gradient for (a loss's
  # target: "not differentiable with respect to argument 'target'"),
  # learnt on a first failing call; they get no gradient (None eagerly,
  # zeros from a graph).
  refused = set()

  def forward(
    args_torch: list[torch.Tensor], *, record: bool, unused: Collection[int] | None = None
  ) -> _saved.Saved:  # the core's `Forward`
    del unused  # every output is computed; the op drops what it need not
    if not record:
      return _saved.Saved(outputs_of(args_torch), no_leaves, has_graph=False)
    leaves = [
      a.requires_grad_(k not in refused) if diff else None
      for k, (a, diff) in enumerate(zip(args_torch, differentiable))
    ]
    while True:
      try:
        return _saved.Saved(outputs_of(args_torch), leaves, has_graph=True)
      except RuntimeError as err:
        # The message names the argument, not its position: take the
        # differentiable arguments out from the last (targets come last)
        # until torch accepts the call.
        left = [
          (k, leaf) for k, leaf in enumerate(leaves) if leaf is not None and leaf.requires_grad
        ]
        if "is not differentiable with respect to" not in str(err) or not left:
          raise
        k, leaf = left[-1]
        refused.add(k)
        leaf.requires_grad_(False)

  def outputs_of(args_torch: list[torch.Tensor]) -> list[torch.Tensor]:
    outs_torch = flat_outputs(args_torch)
    # The torch code must not have written into an argument (a view of TF
    # memory): fresh views start at version 0, in-place ops count up.
    for k, arg_torch in enumerate(args_torch):
      if arg_torch._version:
        raise _modified_error(k, arg_torch, name)
    return outs_torch

  op_name = _op_name(name)
  if tf.executing_eagerly():
    outs_tf = _bridge.call(forward, args_tf, name=op_name, differentiable=differentiable)
  else:
    if output_signature is not None:
      out_specs = _flatten_signature(output_signature, layout)
      how = _signature.DECLARED
      if extra_signature is not None:
        layout["extra_names"] = list(extra_signature)
        out_specs = out_specs + list(extra_signature.values())
      if _compat.in_xla_context():
        out_specs = _static_under_xla(out_specs, flat_outputs, args_tf, name, stand_ins)
    else:
      out_specs, how = _signature.infer(
        flat_outputs, [tf.TensorSpec(a.shape, a.dtype) for a in args_tf], name, stand_ins
      )
    outs_tf = _bridge.call(
      forward, args_tf, out_specs, name=op_name, differentiable=differentiable, specs_found=how
    )
  n_result = layout["n_tensors"]
  result = _pack_result(layout, outs_tf[:n_result])
  if layout.get("extra_names") is not None:
    return Outputs(result, dict(zip(layout["extra_names"], outs_tf[n_result:])))
  return result


def _static_under_xla(
  declared: list[tf.TensorSpec],
  flat_outputs: Callable[[list[torch.Tensor]], list[torch.Tensor]],
  args_tf: Sequence[tf.Tensor],
  name: str,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None,
) -> list[tf.TensorSpec]:
  """Under XLA: the declared output specs with their unknown dimensions
  found, as without a signature, when every argument's shape is static (a
  declared `(None, 1)` on a batch of 256 becomes `(256, 1)`); the declared
  specs otherwise (their unknown dimensions are found when XLA compiles the
  call, `_xla_shapes`). Raises if what the code returns does not fit them."""
  if all(s.shape.is_fully_defined() for s in declared) or not all(
    a.shape.is_fully_defined() for a in args_tf
  ):
    return declared
  found, _ = _signature.infer(
    flat_outputs, [tf.TensorSpec(a.shape, a.dtype) for a in args_tf], name, stand_ins
  )
  fits = len(found) == len(declared) and all(
    f.dtype == d.dtype and d.shape.is_compatible_with(f.shape) for f, d in zip(found, declared)
  )
  if not fits:
    raise ValueError(
      f"{name}: its output_signature declares {declared}, but on these "
      f"arguments (static shapes, under XLA) it returns {found}. Correct the "
      "output_signature, or leave it out: torchbridge then finds the output "
      "specs itself."
    )
  return [tf.TensorSpec(f.shape, d.dtype, d.name) for f, d in zip(found, declared)]


def _modified_error(k: int, arg_torch: torch.Tensor, name: str) -> RuntimeError:
  """The error for torch code that wrote into argument `k` in place."""
  return RuntimeError(
    f"{name} modified its tensor argument {k} (shape "
    f"{tuple(arg_torch.shape)}, dtype {arg_torch.dtype}) in place. Its "
    "torch tensor shares memory with a TF tensor, and TF tensors must "
    "never change (TF may hand the same buffer to other ops): the TF "
    "tensor now holds the modified values. Use out-of-place ops "
    "(`x = x + 1`, not `x.add_(1)`), or copy first (`x = x.clone()`)."
  )


def _output_tensor(leaf: Any, name: str) -> torch.Tensor | None:
  """One leaf of a torch result as the torch tensor that crosses (None for
  None): the one place that says what a torch callable may return."""
  if isinstance(leaf, torch.Tensor) or leaf is None:
    return leaf
  if isinstance(leaf, (bool, int, float, complex, np.number, np.bool_)):
    # A Python or numpy number: a scalar of torch's dtype for it (int64,
    # the default float dtype, complex64, bool).
    return torch.tensor(leaf)
  raise _signature.ResultError(
    f"{name} returned a {type(leaf).__name__} ({leaf!r}) inside its "
    "result; torchbridge passes back torch tensors, numbers (or None) "
    "only. Return it as a tensor, e.g. `torch.tensor(value)`."
  )


def _flatten_result(result: Any, name: str, layout: dict[str, Any]) -> list[torch.Tensor]:
  flat = [_output_tensor(leaf, name) for leaf in tf.nest.flatten(result)]
  tensors = [leaf for leaf in flat if leaf is not None]
  layout.setdefault("structure", result)
  layout.setdefault("is_tensor", [leaf is not None for leaf in flat])
  layout.setdefault("n_tensors", len(tensors))
  layout.setdefault("single", isinstance(layout["structure"], torch.Tensor))
  structure = layout["structure"]
  # pylint: disable-next=unidiomatic-typecheck
  if type(structure) is tuple and all(type(x) is torch.Tensor for x in structure):
    layout.setdefault("tuple_size", len(structure))
  return tensors


def _flatten_signature(output_signature: Any, layout: dict[str, Any]) -> list[tf.TensorSpec]:
  flat = tf.nest.flatten(output_signature)
  layout.update(
    structure=output_signature,
    is_tensor=[True] * len(flat),
    n_tensors=len(flat),
    single=isinstance(output_signature, tf.TensorSpec),
  )
  if type(output_signature) is tuple and all(  # pylint: disable=unidiomatic-typecheck
    isinstance(spec, tf.TensorSpec) for spec in output_signature
  ):
    layout["tuple_size"] = len(output_signature)
  return flat


def _pack_result(layout: dict[str, Any], outs_tf: Sequence[tf.Tensor | None]) -> Any:
  outs = iter(outs_tf)
  flat = [next(outs) if is_tensor else None for is_tensor in layout["is_tensor"]]
  return tf.nest.pack_sequence_as(layout["structure"], flat)


@functools.lru_cache(maxsize=1024)
def _op_name(name: str) -> str:
  cleaned = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name).lstrip("_-/") or "torch"
  return cleaned
