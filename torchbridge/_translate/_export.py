"""The torch side of `translate`: input signatures, example inputs, and
`torch.export` down to the ATen ops `_table` translates."""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
from torch.fx.experimental import symbolic_shapes
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._translate import _export_errors

# Ops TF has whole: kept instead of decomposed into many small ATen ops.
_KEEP_WHOLE = (
  "linear.default",
  "convolution.default",
  "layer_norm.default",
  "native_layer_norm.default",
  "embedding.default",
  "gelu.default",
  "_native_batch_norm_legit_no_training.default",
  "lstm.input",
  "gru.input",
  "rnn_tanh.input",
  "rnn_relu.input",
  "_softmax.default",
  "_log_softmax.default",
  "addmm.default",
  "silu.default",
  "hardtanh.default",
  "hardswish.default",
  "hardsigmoid.default",
  "leaky_relu.default",
  "elu.default",
  "softplus.default",
  "native_group_norm.default",
  "max_pool2d_with_indices.default",
  "avg_pool2d.default",
  "_adaptive_avg_pool2d.default",
  "adaptive_max_pool2d.default",
  "max_pool3d_with_indices.default",
  "avg_pool3d.default",
  "_adaptive_avg_pool3d.default",
  "clamp.default",
  "tril.default",
  "triu.default",
  "cumsum.default",
  "var.correction",
  # Also a workaround: torch 2.13's decomposition of it makes a view of
  # the wrong strides when the batch size is dynamic (GPT-2 fails).
  "scaled_dot_product_attention.default",
)

_KEEP_WHOLE_OPS = frozenset(f"aten.{name}" for name in _KEEP_WHOLE)

# `mutations`: the buffers a training-mode forward writes, one per leading
# output of the graph (their new values); `structure` indexes the outputs
# after them.
Program = collections.namedtuple(
  "Program",
  ["graph", "user_inputs", "state_inputs", "constants", "structure", "mutations"],
  defaults=((),),
)


def check_signature(input_signature: Any) -> list[tf.TensorSpec]:
  """The specs as a list of `tf.TensorSpec`, or a precise error."""
  if isinstance(input_signature, tf.TensorSpec):
    input_signature = [input_signature]
  if not isinstance(input_signature, (list, tuple)) or not all(
    isinstance(s, tf.TensorSpec) for s in input_signature
  ):
    raise TypeError(
      "translate(input_signature): expected a list of tf.TensorSpec, one "
      f"per positional input of the forward; got {input_signature!r}. "
      "Example: input_signature=[tf.TensorSpec([None, 3], tf.float32)]."
    )
  for k, spec in enumerate(input_signature):
    if spec.shape.rank is None:
      raise ValueError(
        f"translate(input_signature): spec {k} ({spec}) has an unknown "
        "rank; give every dimension, with None for a dynamic size, e.g. "
        "tf.TensorSpec([None, 3], tf.float32)."
      )
  return list(input_signature)


def example_inputs(
  specs: Sequence[tf.TensorSpec], given: Sequence[Any] | None
) -> list[torch.Tensor]:
  """torch tensors for export and the parity check: `given`, or random
  values with 2 for dynamic batch sizes and 3 for other dynamic sizes."""
  if given is not None:
    if len(given) != len(specs):
      raise ValueError(
        f"translate(example_inputs): expected {len(specs)} inputs, one per "
        f"spec of input_signature, got {len(given)}."
      )
    tensors = []
    for k, (value, spec) in enumerate(zip(given, specs)):
      array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
      if not spec.shape.is_compatible_with(array.shape):
        raise ValueError(
          f"translate(example_inputs): input {k} has shape "
          f"{list(array.shape)}, which does not fit input_signature "
          f"{spec.shape}."
        )
      tensors.append(torch.from_numpy(array.astype(spec.dtype.as_numpy_dtype)))
    return tensors
  return random_inputs(specs)


def random_inputs(
  specs: Sequence[tf.TensorSpec], size: int = 0, seed: int = 0
) -> list[torch.Tensor]:
  """Random torch tensors of `specs` (normal floats, integers 0 and 1,
  random booleans); an unknown dimension has 2 elements (the first) or 3,
  one more each with size=1 (a second size to check a capture at)."""
  rng = np.random.default_rng(seed + size)
  tensors = []
  for spec in specs:
    shape = [
      (2 + size if a == 0 else 3 + size) if d is None else d
      for a, d in enumerate(spec.shape.as_list())
    ]
    dtype = spec.dtype.as_numpy_dtype
    if spec.dtype.is_floating:
      array = rng.standard_normal(shape).astype(dtype)
    elif spec.dtype == tf.bool:
      array = rng.integers(0, 2, shape).astype(bool)
    else:
      array = rng.integers(0, 2, shape).astype(dtype)
    tensors.append(torch.from_numpy(array))
  return tensors


def export(
  torch_module: torch.nn.Module,
  specs: Sequence[tf.TensorSpec],
  examples_torch: Sequence[torch.Tensor],
  name: str,
  allow_writes: bool = False,
  varargs: bool = False,
  decompose: bool = True,
) -> Program:
  """`torch.export` of the module, decomposed; returns a `Program`.

  `allow_writes`: a forward that writes buffers (BatchNorm in training
  mode) is exported with their new values as outputs (`Program.mutations`)
  instead of refused. `varargs`: the forward takes `*inputs`.
  `decompose=False`: torch's own ops, functionalized, not decomposed into
  those TF translates (what the C++ torch runner runs)."""
  dynamic = tuple(
    {a: _dynamic_dim(k, a) for a, d in enumerate(spec.shape.as_list()) if d is None} or None
    for k, spec in enumerate(specs)
  )
  try:
    with warnings.catch_warnings(), _export_errors.stderr_kept() as printed:
      # nn.LSTM / nn.GRU keep their weights in a plain list; torch warns
      # that it was assigned during export, which changes nothing here.
      warnings.filterwarnings(
        "ignore", "The tensor attributes .* were assigned during export", UserWarning
      )
      # torch.export's own pytree code (torch 2.13) trips its deprecation.
      warnings.filterwarnings(
        "ignore",
        r"`isinstance\(treespec, LeafSpec\)` "
        "is deprecated",
        FutureWarning,
      )
      shapes: Any = dynamic
      if varargs:
        shapes = (dynamic,) if any(d is not None for d in dynamic) else None
      in_export = True
      program = torch.export.export(torch_module, tuple(examples_torch), dynamic_shapes=shapes)
      in_export = False
      program = _decomposed(program, _decompositions() if decompose else {})
  except Exception as err:  # torch.export's errors are many and unrelated
    said = _export_errors.summary(err)
    raise _export_errors.ExportError(
      f"translate({name!r}): torch.export could not export the module with "
      f"input_signature {specs}: {said}. Fixed sizes in place of None, or "
      "example_inputs closer to real data, may help; else keep calling the "
      "module through the bridge. (torch's whole error is this one's cause.)",
      said,
      _export_errors.detail(err, "".join(printed)),
      in_export,
    ) from err
  _check_dynamic_dims(program, specs, name)
  return _program(program, name, allow_writes)


def _dynamic_dim(k: int, axis: int) -> Any:
  auto = getattr(torch.export.Dim, "AUTO", None)
  return auto if auto is not None else torch.export.Dim(f"input{k}_dim{axis}")


def _decompositions() -> dict[Any, Any]:
  return dict(_decomposition_table())


@functools.cache
def _decomposition_table() -> dict[Any, Any]:
  # Built once a process (~0.08 s); callers get a copy.
  table = torch.export.default_decompositions()
  return {op: fn for op, fn in table.items() if str(op) not in _KEEP_WHOLE_OPS}


def _decomposed(
  program: torch.export.ExportedProgram, table: dict[Any, Any]
) -> torch.export.ExportedProgram:
  """`program.run_decompositions(table)`, or `program` itself where that
  would leave its graph as it is: `run_decompositions` costs ~0.4 s a call
  however small the graph (it overrides every CompositeImplicitAutograd op
  torch has), most of a capture of a small MLP."""
  if _in_final_form(program, table):
    return program
  return program.run_decompositions(table)


def _in_final_form(program: torch.export.ExportedProgram, table: dict[Any, Any]) -> bool:
  """True where `run_decompositions(table)` has nothing to do: no
  mutation in the signature, and every node an ATen op of one result that
  is functional (no mutation, no alias of an input: nothing to
  functionalize), not in `table` and not one torch decomposes anyway
  (nothing to decompose). tests/test_export_decompose.py checks it against
  `run_decompositions` on torch's module_db."""
  signature = program.graph_signature
  if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
    return False
  for node in program.graph.nodes:
    if node.op != "call_function":
      continue
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op in table:
      return False
    schema = op._schema
    if schema.is_mutable or len(schema.returns) != 1:
      return False  # (of several results, run_decompositions takes each)
    if any(a.alias_info is not None for a in list(schema.arguments) + list(schema.returns)):
      return False
    if _compat.op_has_python_kernel(op):
      return False
    # A composite op stays whole only if the translation keeps it and
    # torch preserves it (it decomposes some whatever the table says).
    if _compat.op_is_composite(op) and (
      str(op) not in _KEEP_WHOLE_OPS or not _compat.export_preserves_composite(op)
    ):
      return False
  return True


def _check_dynamic_dims(
  program: torch.export.ExportedProgram, specs: Sequence[tf.TensorSpec], name: str
) -> None:
  placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
  user = program.graph_signature.user_inputs
  for k, (input_name, spec) in enumerate(zip(user, specs)):
    shape = placeholders[input_name].meta["val"].shape
    for axis, d in enumerate(spec.shape.as_list()):
      if d is None and symbolic_shapes.is_concrete_int(shape[axis]):
        size = int(shape[axis])
        why = (
          f"torch.export fixes every dimension of size {size} in the "
          f"example inputs, so pass example_inputs with a size >= 2 "
          f"there"
          if size < 2
          else f"the model's code needs that size fixed; give it in the spec "
          f"(tf.TensorSpec with {size} there)"
        )
        raise ValueError(
          f"translate({name!r}): input_signature says input {k} has a "
          f"dynamic size in dimension {axis}, but torch.export specialized "
          f"it to {size}: {why}."
        )


def _program(
  program: torch.export.ExportedProgram, name: str, allow_writes: bool = False
) -> Program:
  signature = program.graph_signature
  kinds = torch.export.graph_signature.InputKind
  state_inputs: dict[str, str] = {}
  constants: dict[str, np.ndarray] = {}
  for spec in signature.input_specs:
    if spec.kind in (kinds.PARAMETER, kinds.BUFFER):
      state_inputs[spec.arg.name] = spec.target
    elif spec.kind == kinds.CONSTANT_TENSOR:
      constants[spec.arg.name] = program.constants[spec.target].detach().cpu().numpy()
    elif spec.kind != kinds.USER_INPUT:
      raise ValueError(
        f"translate({name!r}): the exported graph takes a "
        f"{spec.kind.name} input ({spec.target}), which has no "
        "TF translation; keep calling it through the bridge."
      )
  if signature.user_inputs_to_mutate or (signature.buffers_to_mutate and not allow_writes):
    raise ValueError(
      f"translate({name!r}): the forward writes tensors in eval mode "
      f"({sorted(signature.buffers_to_mutate.values())}); a translation "
      "computes outputs only: keep calling the module through the bridge."
    )
  out_kinds = torch.export.graph_signature.OutputKind
  mutations = [s.target for s in signature.output_specs if s.kind == out_kinds.BUFFER_MUTATION]
  count = len(signature.output_specs) - len(mutations)
  structure = program.call_spec.out_spec.unflatten(list(range(count)))
  return Program(
    program.graph,
    list(signature.user_inputs),
    state_inputs,
    constants,
    _plain(structure),
    tuple(mutations),
  )


def _plain(structure: Any) -> Any:
  """Torch's output structure with indices as leaves, as TF nests it."""
  if isinstance(structure, tuple) and hasattr(structure, "_fields"):
    return type(structure)(*[_plain(s) for s in structure])
  if isinstance(structure, (list, tuple)):
    return type(structure)(_plain(s) for s in structure)
  if isinstance(structure, dict):
    return {k: _plain(v) for k, v in structure.items()}
  return structure


def flatten_like(structure: Any, value: Any) -> dict[int, Any]:
  """`{index: torch tensor}` of `value`, walked along `structure`."""
  if isinstance(structure, int):
    return {structure: value}
  flat: dict[int, Any] = {}
  items = structure.items() if isinstance(structure, dict) else enumerate(structure)
  for key, sub in items:
    flat.update(flatten_like(sub, value[key]))
  return flat
