"""The lowering of a `torch.export` program: torch's decompositions, less
the ops TF has whole (`_KEEP_WHOLE`), and the check that spares the
lowering where it would change nothing."""

from __future__ import annotations

import functools
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge

from torchbridge._frameworks import _compat

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


def table() -> dict[Any, Any]:
  """The decompositions of the translation: torch's default ones, less
  the ops TF has whole (a copy)."""
  return dict(_decomposition_table())


@functools.cache
def _decomposition_table() -> dict[Any, Any]:
  # Built once a process (~0.08 s); callers get a copy.
  table = torch.export.default_decompositions()
  return {op: fn for op, fn in table.items() if str(op) not in _KEEP_WHOLE_OPS}


def stays_whole(op: Any) -> bool:
  """Whether decomposing for the translation keeps `op` whole."""
  return (
    isinstance(op, torch._ops.OpOverload)
    and str(op) in _KEEP_WHOLE_OPS
    and (not _compat.op_is_composite(op) or _compat.export_preserves_composite(op))
  )


def decomposed(
  program: torch.export.ExportedProgram, table: dict[Any, Any]
) -> torch.export.ExportedProgram:
  """`program.run_decompositions(table)`, or `program` itself where that
  would leave its graph as it is: `run_decompositions` costs ~0.4 s a call
  however small the graph (it overrides every CompositeImplicitAutograd op
  torch has), most of a capture of a small MLP."""
  if in_final_form(program, table):
    return program
  return program.run_decompositions(table)


def runs_as_exported(program: torch.export.ExportedProgram) -> bool:
  """True where the C++ torch runner can run torch.export's graph as it
  is, each node as eager torch dispatches it (composite ops and views
  included), without `run_decompositions({})` (BERT-base's: 5 s): nothing
  written (no mutation in the signature, no in-place op), every node an op
  (its `py_kernels` are the Python dispatcher's, which tracing uses and
  eager dispatch does not) or size arithmetic of Python's `operator`; no
  submodule (a region under `no_grad` or autocast)."""
  signature = program.graph_signature
  if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
    return False
  for node in program.graph.nodes:
    if node.op in ("call_module", "call_method", "get_attr"):
      return False
    if node.op != "call_function":
      continue
    op = node.target
    if getattr(op, "__module__", None) in ("_operator", "operator"):
      continue
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
      return False
  return True


def in_final_form(program: torch.export.ExportedProgram, table: dict[Any, Any]) -> bool:
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
