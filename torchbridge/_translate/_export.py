"""The torch side of `translate`: input signatures, example inputs, and
`torch.export` down to the ATen ops `_table` translates."""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
from torch.fx.experimental import symbolic_shapes
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._translate import _decompose
from torchbridge._translate import _export_errors
from torchbridge._translate import _refusal

# `mutations`: the buffers a training-mode forward writes, one per leading
# output of the graph (their new values); `structure` indexes the outputs
# after them.
Program = collections.namedtuple(
  "Program",
  ["graph", "user_inputs", "state_inputs", "constants", "structure", "mutations"],
  defaults=((),),
)


def export(
  torch_module: torch.nn.Module,
  specs: Sequence[tf.TensorSpec],
  examples_torch: Sequence[torch.Tensor],
  name: str,
) -> Program:
  """`torch.export` of the module, lowered to the ops `_table` translates
  (`lower`); returns a `Program` (what `tb.translate` serves)."""
  return lower(export_program(torch_module, specs, examples_torch, name), specs, name)


def export_program(
  torch_module: torch.nn.Module,
  specs: Sequence[tf.TensorSpec],
  examples_torch: Sequence[torch.Tensor],
  name: str,
  varargs: bool = False,
) -> torch.export.ExportedProgram:
  """`torch.export.export` of the module at `specs` (a dynamic size for
  every None), torch's own ops; `varargs`: the forward takes `*inputs`.
  It holds the module's tensors (`state_dict`): keep it no longer than
  the capture that lowers it.

  Raises:
    ExportError: torch.export refused, in one sentence (`summary`).
  """
  dynamic = tuple(
    {a: _dynamic_dim(k, a) for a, d in enumerate(spec.shape.as_list()) if d is None} or None
    for k, spec in enumerate(specs)
  )
  shapes: Any = dynamic
  if varargs:
    shapes = (dynamic,) if any(d is not None for d in dynamic) else None
  with _quiet() as printed:
    try:
      return torch.export.export(torch_module, tuple(examples_torch), dynamic_shapes=shapes)
    except Exception as err:  # torch.export's errors are many and unrelated
      raise _export_error(err, specs, name, "".join(printed)) from err


def lower(
  program_torch: torch.export.ExportedProgram,
  specs: Sequence[tf.TensorSpec],
  name: str,
  allow_writes: bool = False,
  decompose: bool = True,
  prefix: str = "",
) -> Program:
  """The exported program as a `Program`: decomposed to the ops `_table`
  translates, or (`decompose=False`) torch's own ops functionalized (what
  the C++ torch runner runs). `program_torch` is left as it was.

  `allow_writes`: a forward that writes buffers (BatchNorm in training
  mode) is lowered with their new values as outputs (`Program.mutations`)
  instead of refused. `prefix`: where the exported module called the
  user's as a submodule (`module.`), taken off the state's names, so a
  `Program` names the user's tensors as its `state_dict` does."""
  lowered = lowered_export(program_torch, specs, name, decompose)
  return as_program(lowered, name, allow_writes, prefix)


def lowered_export(
  program_torch: torch.export.ExportedProgram,
  specs: Sequence[tf.TensorSpec],
  name: str,
  decompose: bool = True,
) -> torch.export.ExportedProgram:
  """`lower`'s first half: torch's program decomposed (or functionalized),
  its dynamic sizes checked."""
  with _quiet() as printed:
    try:
      if not decompose and _decompose.runs_as_exported(program_torch):
        program = program_torch
      else:
        program = _decompose.decomposed(program_torch, _decompose.table() if decompose else {})
    except Exception as err:  # torch's decompositions, on the user's graph
      raise _export_error(err, specs, name, "".join(printed)) from err
  _check_dynamic_dims(program, specs, name)
  for checked in (program_torch, program):
    guard = _compat.export_unmet_guard(checked)
    if guard is not None:
      raise ValueError(
        f"translate({name!r}): torch.export's program holds only where {guard} (the "
        "model's code branches on a dynamic size); give that dimension a fixed size in "
        "the spec."
      )
  return program


def state_reads(program: Program, state_names: Mapping[str, str]) -> dict[str, str]:
  """`{placeholder: canonical name}` of the module tensors the program
  reads (`state_names`: state_dict name -> canonical name).

  Raises:
    Refusal: the forward reads a tensor that is not a parameter or buffer.
  """
  reads = {}
  for placeholder, target in program.state_inputs.items():
    if target not in state_names:
      raise _refusal.Refusal(
        "export",
        f"the forward reads the tensor {target!r}, which is not a parameter or buffer of "
        "the module: register it with nn.Parameter or register_buffer",
      )
    reads[placeholder] = state_names[target]
  return reads


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
  """torch.export's known warnings off; what it prints to stderr kept."""
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
    yield printed


def _export_error(
  err: Exception, specs: Sequence[tf.TensorSpec], name: str, printed: str
) -> _export_errors.ExportError:
  said = _export_errors.summary(err)
  return _export_errors.ExportError(
    f"translate({name!r}): torch.export could not export the module with "
    f"input_signature {specs}: {said}. Fixed sizes in place of None, or "
    "example_inputs closer to real data, may help; else keep calling the "
    "module through the bridge. (torch's whole error is this one's cause.)",
    said,
    _export_errors.detail(err, printed),
  )


def _dynamic_dim(k: int, axis: int) -> Any:
  auto = getattr(torch.export.Dim, "AUTO", None)
  return auto if auto is not None else torch.export.Dim(f"input{k}_dim{axis}")


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


def as_program(
  program: torch.export.ExportedProgram, name: str, allow_writes: bool, prefix: str = ""
) -> Program:
  """`lower`'s second half: a lowered program as a `Program`."""

  def own(target: str) -> str:
    return target[len(prefix) :] if prefix and target.startswith(prefix) else target

  signature = program.graph_signature
  kinds = torch.export.graph_signature.InputKind
  state_inputs: dict[str, str] = {}
  constants: dict[str, np.ndarray] = {}
  for spec in signature.input_specs:
    if spec.kind in (kinds.PARAMETER, kinds.BUFFER):
      state_inputs[spec.arg.name] = own(spec.target)
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
  mutations = [own(s.target) for s in signature.output_specs if s.kind == out_kinds.BUFFER_MUTATION]
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
