"""One graph call of a torch module, captured with `torch.export`, run as
TF ops and checked against torch before it is used.

`capture` is the TF runner's capture: the module in its current modes
(training-mode dropout and BatchNorm included), the call's arguments as
given (non-tensor ones are baked in, so the caller keys on them), the
weights read from the module's variables. The check runs torch and the TF
graph on random inputs (a second size where a dimension is unknown) and
compares outputs, written buffers and the gradients of every floating
input and trainable parameter; dropout's draws are torch's in that
comparison, and TF's own draws are checked by their keep rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._translate import _export
from torchbridge._translate import _export_errors
from torchbridge._translate import _fx_to_tf
from torchbridge._translate._aten import _table

# (outputs rtol, outputs atol, gradients rtol, gradients atol); an atol is
# relative to the largest |torch value| of the tensor compared, when > 1.
TOLERANCES = {
  tf.float64: (1e-10, 1e-10, 1e-8, 1e-9),
  tf.float32: (1e-5, 1e-6, 1e-4, 1e-5),
  tf.float16: (1e-2, 1e-3, 5e-2, 1e-2),
  tf.bfloat16: (2e-2, 1e-2, 1e-1, 5e-2),
}


class Refusal(Exception):
  """Why a call cannot run as TF ops: `what` is "op" (an op without a
  translation), "export" (torch.export refused), "check" (the translation
  differs from torch) or "translation" (an op's translation raised)."""

  def __init__(
    self, what: str, reason: str, detail: str = "", export_refused: bool = False
  ) -> None:
    super().__init__(reason)
    self.what = what
    self.reason = reason  # one sentence
    self.detail = detail  # torch's whole error, where there is one
    # torch.export.export itself refused: so would the C++ runner's export.
    self.export_refused = export_refused


class FlatCall(torch.nn.Module):
  """The module called with the call's flat tensors (the exported inputs)."""

  def __init__(self, module: torch.nn.Module, substitute: Callable[..., Any]) -> None:
    super().__init__()
    self.module = module
    self._substitute = substitute

  def forward(self, *args_torch: torch.Tensor) -> Any:
    args, kwargs = self._substitute(list(args_torch))
    return self.module(*args, **kwargs)


class Capture:
  """A captured call: `run(args_tf)` builds its TF ops in the caller's
  graph and returns `(result, {buffer name: new value})`."""

  def __init__(
    self,
    program: _export.Program,
    variables: Mapping[str, tf.Variable],
    state_names: Mapping[str, str],
    seconds: float,
  ) -> None:
    self.program = program
    self._variables = variables
    # placeholder -> the variable's name (the module's canonical name)
    self._state = {p: state_names[inner_name(t)] for p, t in program.state_inputs.items()}
    self.mutated = tuple(state_names[inner_name(t)] for t in program.mutations)
    self.seconds = seconds  # export, translation and check
    self.random = bool(_fx_to_tf.random_nodes(program.graph))

  def run(
    self,
    args_tf: Sequence[tf.Tensor],
    draws: Mapping[str, Any] | None = None,
    drawn: dict[str, Any] | None = None,
  ) -> tuple[Any, dict[str, tf.Tensor]]:
    values: dict[str, Any] = dict(zip(self.program.user_inputs, args_tf))
    values.update({p: tf.convert_to_tensor(self._variables[n]) for p, n in self._state.items()})
    values.update({n: tf.constant(c) for n, c in self.program.constants.items()})
    flat_tf = _fx_to_tf.run(self.program.graph, values, draws, drawn)
    n = len(self.mutated)
    writes = dict(zip(self.mutated, flat_tf[:n]))
    outputs = flat_tf[n:]
    return tf.nest.map_structure(lambda i: outputs[i], self.program.structure), writes


def inner_name(target: str) -> str:
  return target[len("module.") :] if target.startswith("module.") else target


def capture(
  module: torch.nn.Module,
  substitute: Callable[[list[torch.Tensor]], tuple[Sequence[Any], dict[str, Any]]],
  specs: Sequence[tf.TensorSpec],
  variables: Mapping[str, tf.Variable],
  state_names: Mapping[str, str],
  name: str,
) -> Capture:
  """Exports `module` called through `substitute`, translates and checks it.

  Args:
    module: the torch module, in the modes of the call, its tensors holding
      the current values.
    substitute: `substitute(flat_args_torch) -> (args, kwargs)` of the call.
    specs: the `tf.TensorSpec` of each flat tensor argument (None: any size).
    variables: `{canonical name: tf.Variable}` of the module's state.
    state_names: `{state_dict name: canonical name}`.
    name: the module's name, for messages.

  Raises:
    Refusal: with what sent the call back to torch.
  """
  start = time.perf_counter()
  flat = FlatCall(module, substitute)
  dynamic = any(d is None for s in specs for d in s.shape.as_list())
  examples = _export.random_inputs(specs, 0, seed=0)
  try:
    exported = _export.export(flat, specs, examples, name, allow_writes=True, varargs=True)
  except _export_errors.ExportError as err:
    raise Refusal("export", err.summary, err.detail, err.in_export) from err
  except ValueError as err:  # the export's own checks (dynamic dimensions)
    raise Refusal("export", str(err)) from err
  program = exported
  missing = _fx_to_tf.untranslated(program.graph)
  if missing:
    raise Refusal("op", "; ".join(f"{op}: {why}" for op, why in sorted(missing.items())))
  for target in list(program.state_inputs.values()):
    if inner_name(target) not in state_names:
      raise Refusal(
        "export",
        f"the forward reads the tensor {inner_name(target)!r}, which is not a "
        "parameter or buffer of the module (register it with "
        "register_buffer to have it run as TF ops)",
      )
  result = Capture(program, variables, state_names, 0.0)
  for size in (0, 1) if dynamic else (0,):
    _check(result, flat, module, specs, variables, state_names, size, name)
  if result.random:
    _check_draws(result, specs, name)
  result.seconds = time.perf_counter() - start
  return result


def _state_torch(
  module: torch.nn.Module, variables: Mapping[str, tf.Variable], state_names: Mapping[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
  """Copies of the variables' current values as torch leaves (trainable
  parameters require grad), by canonical name; and the same by every
  state_dict name."""
  canonical: dict[str, torch.Tensor] = {}
  for n, var in variables.items():
    value = torch.from_numpy(np.array(var.numpy()))
    canonical[n] = value.requires_grad_(bool(var.trainable) and value.is_floating_point())
  by_name = {n: canonical[c] for n, c in state_names.items()}
  return canonical, by_name


def _check(
  result: Capture,
  flat: FlatCall,
  module: torch.nn.Module,
  specs: Sequence[tf.TensorSpec],
  variables: Mapping[str, tf.Variable],
  state_names: Mapping[str, str],
  size: int,
  name: str,
) -> None:
  """Compares outputs, written buffers and gradients with torch."""
  del module
  program = result.program
  inputs_torch = [
    x.requires_grad_(True) if x.is_floating_point() else x
    for x in _export.random_inputs(specs, size, seed=1)
  ]
  canonical, by_name = _state_torch(flat.module, variables, state_names)
  draws: dict[str, Any] | None = None
  if result.random:
    flat_torch, masks = _run_exported(program, inputs_torch, by_name)
    draws = {k: tf.constant(v.numpy()) for k, v in masks.items()}
    outputs_torch = flat_torch[len(result.mutated) :]
    writes_torch = dict(zip(result.mutated, flat_torch[: len(result.mutated)]))
  else:
    tensors = {f"module.{n}": t for n, t in by_name.items()}
    written = {n: canonical[n].detach().clone() for n in result.mutated}
    for n, c in state_names.items():
      if c in written:
        tensors[f"module.{n}"] = written[c]
    try:
      out = torch.func.functional_call(flat, tensors, tuple(inputs_torch))
    except Exception as err:  # the user's forward on random inputs
      raise Refusal(
        "check", f"the forward raised on random inputs: {type(err).__name__}: {err}"
      ) from err
    flat_index = tf.nest.flatten(program.structure)
    by_index = _export.flatten_like(program.structure, out)
    outputs_torch = [by_index[i] for i in sorted(flat_index)]
    writes_torch = written
  args_tf = [tf.constant(x.detach().numpy()) for x in inputs_torch]
  trainable = [v for v in variables.values() if v.trainable]
  # Gradients of a random cotangent, for every floating input and
  # trainable parameter (of the floating outputs torch differentiates).
  rng = np.random.default_rng(2 + size)
  differentiated = [
    k for k, o in enumerate(outputs_torch) if o.is_floating_point() and o.requires_grad
  ]
  cotangents = [rng.standard_normal(tuple(outputs_torch[k].shape)) for k in differentiated]
  leaves_tf = [a for a in args_tf if a.dtype.is_floating] + trainable

  # In a graph, as the call will run (TF's eager gradients of some ops, a
  # 3-D convolution's among them, fail for want of attributes). Traced by
  # get_concrete_function, then called: one new tf.function per check,
  # called, would make TF warn of "frequent retracing" from the fifth
  # capture of a process on.
  def tf_side() -> tuple[list[tf.Tensor], dict[str, tf.Tensor], list[Any]]:
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(leaves_tf)
      result_tf, writes_tf = result.run(args_tf, draws)
      outputs_tf = _flat_outputs(program.structure, result_tf)
    if not differentiated:
      return outputs_tf, writes_tf, []
    grads = tape.gradient(
      [outputs_tf[k] for k in differentiated],
      leaves_tf,
      output_gradients=[
        tf.constant(c, outputs_tf[k].dtype) for k, c in zip(differentiated, cotangents)
      ],
    )
    return (
      outputs_tf,
      writes_tf,
      [
        tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, leaves_tf)
      ],
    )

  try:
    traced = tf.function(tf_side, autograph=False).get_concrete_function()
    outputs_tf, writes_tf, grads_tf = traced()
  except _table.Refused as err:
    raise Refusal("op", str(err)) from err
  except _table.Failed as err:
    raise Refusal("translation", str(err)) from err
  where = (
    f"{'second ' if size else ''}random inputs of shapes {[list(x.shape) for x in inputs_torch]}"
  )
  for i, (got, want) in enumerate(zip(outputs_tf, outputs_torch)):
    _compare(got, want, f"output {i}", where, grads=False)
  for n in result.mutated:
    _compare(writes_tf[n], writes_torch[n], f"buffer {n!r} written", where, grads=False)
  if not differentiated:
    return
  leaves_torch = [x for x in inputs_torch if x.is_floating_point()] + [
    canonical[n] for n, v in variables.items() if v.trainable
  ]
  grads_torch = torch.autograd.grad(
    [outputs_torch[k] for k in differentiated],
    leaves_torch,
    [torch.from_numpy(c).to(outputs_torch[k].dtype) for k, c in zip(differentiated, cotangents)],
    allow_unused=True,
  )
  names = [f"input {k}" for k, a in enumerate(args_tf) if a.dtype.is_floating] + [
    f"parameter {n!r}" for n, v in variables.items() if v.trainable
  ]
  for label, g_tf, g_torch, leaf in zip(names, grads_tf, grads_torch, leaves_torch):
    if g_torch is None:
      g_torch = torch.zeros_like(leaf)
    _compare(g_tf, g_torch, f"gradient of {label}", where, grads=True)


def _flat_outputs(structure: Any, result_tf: Any) -> list[tf.Tensor]:
  flat_index = tf.nest.flatten(structure)
  by_index = dict(zip(flat_index, tf.nest.flatten(result_tf)))
  return [by_index[i] for i in sorted(flat_index)]


def _run_exported(
  program: _export.Program,
  inputs_torch: Sequence[torch.Tensor],
  by_name: Mapping[str, torch.Tensor],
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
  """Runs the exported graph in torch, recording its random draws."""
  masks: dict[str, torch.Tensor] = {}
  random = set(_fx_to_tf.random_nodes(program.graph))

  class _Recorder(torch.fx.Interpreter):
    def run_node(self, n: torch.fx.Node) -> Any:
      value = super().run_node(n)
      if n.name in random:
        masks[n.name] = value[1].detach()
      return value

  module = torch.fx.GraphModule(torch.nn.Module(), program.graph)
  args = []
  user = dict(zip(program.user_inputs, inputs_torch))
  for node in program.graph.nodes:
    if node.op != "placeholder":
      continue
    if node.name in user:
      args.append(user[node.name])
    elif node.name in program.state_inputs:
      args.append(by_name[inner_name(program.state_inputs[node.name])])
    else:
      args.append(torch.from_numpy(program.constants[node.name]))
  flat = _Recorder(module).run(*args)
  return list(flat), masks


def _check_draws(result: Capture, specs: Sequence[tf.TensorSpec], name: str) -> None:
  """TF's own random draws: each dropout keeps 1 - p of its elements."""
  args_tf = [tf.constant(x.numpy()) for x in _export.random_inputs(specs, 0, seed=3)]
  drawn: dict[str, Any] = {}
  result.run(args_tf, drawn=drawn)
  nodes = {n.name: n for n in result.program.graph.nodes}
  for node_name, mask in drawn.items():
    p = float(nodes[node_name].args[1])
    count = int(tf.size(mask))
    if count == 0 or p in (0.0, 1.0):
      continue
    kept = float(tf.reduce_mean(tf.cast(mask, tf.float64)))
    bound = 6 * math.sqrt(p * (1 - p) / count) + 1e-9
    if abs(kept - (1 - p)) > bound:
      raise Refusal(
        "check",
        f"dropout {node_name!r} kept {kept:.3f} of {count} elements where "
        f"torch keeps {1 - p:.3f} (bound {bound:.3f})",
      )


def _compare(
  got_tf: tf.Tensor, want_torch: torch.Tensor, what: str, where: str, grads: bool
) -> None:
  got = np.asarray(got_tf.numpy())
  want = want_torch.detach().cpu().numpy()
  if got.shape != want.shape:
    raise Refusal(
      "check", f"{what} has shape {list(got.shape)} in TF, {list(want.shape)} in torch ({where})"
    )
  if not np.issubdtype(want.dtype, np.inexact):
    if not np.array_equal(got, want):
      raise Refusal("check", f"{what} differs from torch's ({where})")
    return
  rtol, atol, grad_rtol, grad_atol = TOLERANCES.get(got_tf.dtype, (0.0, 0.0, 0.0, 0.0))
  if grads:
    rtol, atol = grad_rtol, grad_atol
  got64, want64 = got.astype(np.float64), want.astype(np.float64)
  finite = np.isfinite(want64)
  scale = max(1.0, float(np.max(np.abs(want64[finite]), initial=0.0)))
  if not np.allclose(got64, want64, rtol=rtol, atol=atol * scale, equal_nan=True):
    diff = float(np.nanmax(np.abs(got64 - want64), initial=0.0))
    raise Refusal(
      "check",
      f"{what} differs from torch's by up to {diff:.3g} (tolerance {atol * scale:.3g} + "
      f"{rtol} x |torch|, {got_tf.dtype.name}; {where})",
    )
