"""A call's arguments: the TF tensors found in them, the static values kept,
and the checks every wrapper makes before a call (output signatures, XLA)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._crossing import _adopt
from torchbridge._crossing import _exchange
from torchbridge._frameworks import _compat

_XLA_UNSUPPORTED = """\
{name} cannot run inside a tf.function compiled with XLA (jit_compile=True)
here: torchbridge's XLA custom call could not be built or loaded (see
below). Compile without XLA instead: `tf.function(fn)` or
`tf.function(fn, jit_compile=False)`, and in Keras `model.compile(...,
jit_compile=False)`. The rest of the model can stay compiled if it lives in a
separate tf.function. To run a trained `tb.TorchModule` under XLA, translate
it into TF ops that read the same variables: `tb.translate(module,
input_signature)` (the guide "Serving with tb.translate"), or leave the
module's `run=` at its default, "auto", which runs its TF translation."""


class _BoundCall:
  """A call's arguments, split into TF tensors and static values."""

  def __init__(
    self,
    structure: tuple[Sequence[Any], dict[str, Any]],
    flat: list[Any],
    positions: list[int],
    args_tf: list[tf.Tensor],
  ) -> None:
    self._structure = structure
    self._flat = flat
    self._positions = positions
    self.args_tf = args_tf
    # The common call, f(x, y) with tensors only, needs no nest packing.
    args, kwargs = structure
    self.only_tensors = not kwargs and len(args) == len(flat) == len(positions)

  def static_key(self) -> str:
    """The call with its tensors left out: its structure and non-tensor
    values (a capture of the call bakes those in)."""
    if self.only_tensors:
      return f"{len(self._flat)} tensors"
    positions = set(self._positions)
    marked = [
      "<tensor>" if k in positions else f"{type(v).__qualname__}:{v!r}"
      for k, v in enumerate(self._flat)
    ]
    return repr(tf.nest.pack_sequence_as(self._structure, marked))

  def substitute(self, args_torch: Sequence[torch.Tensor]) -> tuple[Sequence[Any], dict[str, Any]]:
    """The original arguments with torch tensors in the TF tensors' places."""
    if self.only_tensors:
      return tuple(args_torch), {}
    flat = list(self._flat)
    for pos, arg_torch in zip(self._positions, args_torch):
      flat[pos] = arg_torch
    return tf.nest.pack_sequence_as(self._structure, flat)


def bind_arguments(name: str, structure: tuple[Sequence[Any], dict[str, Any]]) -> _BoundCall:
  """Finds the TF tensors in a nest of call arguments."""
  flat = tf.nest.flatten(structure)
  positions, args_tf = [], []
  leaf = None
  try:
    for pos, leaf in enumerate(flat):
      _exchange.check_tf_leaf(leaf, f"{name}()")
      if _exchange.is_tf_tensor(leaf):
        arg_tf = tf.convert_to_tensor(leaf)
        if not _adopt.has_torch_dtype(arg_tf.dtype):
          raise TypeError(
            f"{name}() received a tensor of dtype {arg_tf.dtype.name} (shape "
            f"{arg_tf.shape}), which torch has no dtype for. Convert it "
            "first, e.g. `tf.cast(x, tf.float32)`, or `tf.strings.to_number` "
            "for strings."
          )
        positions.append(pos)
        args_tf.append(arg_tf)
  except TypeError as err:
    args, kwargs = structure
    where = _exchange.nest_path(args, leaf, "args") or _exchange.nest_path(kwargs, leaf, "kwargs")
    raise TypeError(_exchange.received_at(str(err), f"{name}()", where)) from err
  return _BoundCall(structure, flat, positions, args_tf)


def check_output_signature(output_signature: Any, owner: str) -> Any:
  """Returns `output_signature` if it is None or a nest of tf.TensorSpec;
  raises a TypeError that shows the form otherwise."""
  if output_signature is not None:
    for spec in tf.nest.flatten(output_signature):
      if not isinstance(spec, tf.TensorSpec):
        raise TypeError(
          f"{owner} output_signature must hold tf.TensorSpec leaves, got "
          f"{spec!r}. Example: output_signature=(tf.TensorSpec([None, 4], "
          "tf.float32), tf.TensorSpec([], tf.int64))."
        )
  return output_signature


def check_not_xla(name: str) -> bool:
  """Whether the graph being traced is compiled by XLA; raises if it is and
  bridged calls cannot run there (the XLA custom call's library,
  csrc/xla/, cannot be had: `_native._xla`)."""
  if not _compat.in_xla_context():
    return False
  # Imported here: only a call traced under XLA builds or loads it.
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  reason = _xla.unavailable()
  if reason is not None:
    raise NotImplementedError(
      _XLA_UNSUPPORTED.format(name=name)
      + f"\n(torchbridge's XLA custom call is unavailable: {reason})"
    )
  return True
