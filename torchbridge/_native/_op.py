"""Emitting the native op: `call` puts one `TorchbridgeCall` in the graph
(or runs it eagerly) with a registered Python callable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._native import _callbacks
from torchbridge._native import _loader


@tf.autograph.experimental.do_not_convert
def call(
  callback: Callable[..., Any],
  inputs_tf: Sequence[tf.Tensor],
  out_dtypes: Sequence[tf.DType],
  out_shapes: Sequence[Any] | None = None,
  name: str | None = None,
  torch_tensors: bool = False,
  whole_tensor_outputs: Sequence[int] = (),
  output_shapes: Callable[..., Any] | None = None,
) -> list[tf.Tensor]:
  """Emits one `TorchbridgeCall` op that runs `callback` on `inputs_tf`.

  Args:
    callback: `callback(capsules) -> capsules`: receives a list of DLPack
      capsules (one per input, "dltensor", to be consumed with
      `torch.utils.dlpack.from_dlpack`) and returns a list or tuple of DLPack
      capsules (`torch.utils.dlpack.to_dlpack`), exactly one per declared
      output, each of the declared dtype and a compatible shape, dense
      row-major, 64-byte aligned, on the op's device (see `torch_callback`,
      which makes sure of that); or None for an output that
      `output_required` says nothing consumes. It is called on TF's threads,
      possibly from several at once. With `torch_tensors`, it receives and
      returns torch tensors instead (see below). Or a
      `_callbacks.NativeCallback`: a C function the CPU kernel runs in place
      of Python.
    inputs_tf: list of TF tensors.
    out_dtypes: list of TF dtypes of the outputs.
    out_shapes: list of shapes (`tf.TensorShape`, lists with None for
      unknown dimensions, or None for unknown rank), one per output; they are
      the outputs' static shapes in the graph and are checked at run time.
      None: all unknown.
    name: name of the op.
    torch_tensors: whether `callback` takes a list of torch tensors (zero-copy
      views of the inputs) and returns a list of torch tensors (or None for
      unused outputs). The op then converts both ways in C++
      (csrc/torch_interop.cc), adopting outputs that TF can use as they are
      without a copy and handing the others to `tf_viewable` (one counted
      copy); with a library built without that file, `torch_callback` does
      the same in Python.
    whole_tensor_outputs: with `torch_tensors`, the indices of the outputs
      whose torch tensors TF holds whole, so that their Python objects (and
      attributes set on them) live as long as TF's buffer, as with torch's
      DLPack export. Other outputs hold only their memory: cheaper to
      release, and the Python object dies when Python drops it.
    output_shapes: for an op under XLA whose `out_shapes` are not all
      known: `output_shapes(input specs, declared shapes) -> shapes`, every
      output's shape (all known, agreeing with the declared one) for
      inputs of the given concrete `tf.TensorSpec`s; called when XLA
      compiles the op (`_callbacks.output_shapes`).

  Returns:
    List of TF tensors, one per output.

  Raises:
    RuntimeError: if the native op is not available (check `available()`).

  In a graph (`tf.function`), `callback` stays registered as long as the
  graph lives. Eagerly, the op runs at once and the registration ends.
  """
  lib = _loader.load()
  if lib is None:
    raise RuntimeError(
      f"the torchbridge native TF op is not available ({_loader.status()}); check "
      "torchbridge._native._loader.available() before calling call()"
    )
  out_dtypes = [tf.as_dtype(d) for d in out_dtypes]
  if out_shapes is None:
    shapes = []
  else:
    shapes = [tf.TensorShape(s) for s in out_shapes]
    if len(shapes) != len(out_dtypes):
      raise ValueError(f"{len(shapes)} out_shapes for {len(out_dtypes)} out_dtypes")
  if (
    torch_tensors
    and not isinstance(callback, _callbacks.NativeCallback)
    and not _loader.has_torch_interop()
  ):
    callback, torch_tensors = _callbacks.torch_callback(callback), False
  eager = tf.executing_eagerly()
  graph = None if eager else tf.compat.v1.get_default_graph()
  callback_id = _callbacks.register(callback, graph, output_shapes)
  try:
    outs = lib.torchbridge_call(
      inputs=list(inputs_tf),
      Tout=out_dtypes,
      output_shapes=shapes,
      callback_id=callback_id,
      torch_tensors=torch_tensors,
      whole_tensor_outputs=list(whole_tensor_outputs) if torch_tensors else [],
      name=name,
    )
  except BaseException:
    _callbacks.release([callback_id])
    raise
  if not out_dtypes:
    outs = []  # the wrapper returns the Operation
  if eager:
    _compat.wait_for_async_eager()
    _callbacks.release([callback_id])
  return list(outs)
