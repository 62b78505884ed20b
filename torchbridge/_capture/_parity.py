"""The one check of a capture against torch, before any call uses it.

Both runners hand `check` a candidate: a function that runs their capture
(the TF translation, or the C++ runner's op) on a trial's random inputs
and weights and returns its outputs, written buffers and gradients.
`check` runs torch on the same trial (the module's forward; for a TF
translation that draws random numbers, the exported program with its
draws recorded, which the candidate replays) and compares everything
against the one tolerance table (`_translate/_tolerance.py`): every
output, every buffer written, and the gradients, for a random cotangent,
of every trainable parameter and floating input. Where a dimension is
unknown, a second size is checked too. The user's torch random state is
put back after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._state import _torch_state
from torchbridge._translate import _export
from torchbridge._translate import _inputs
from torchbridge._translate import _fx_to_tf
from torchbridge._translate import _refusal
from torchbridge._translate import _tolerance


class Trial(NamedTuple):
  """What a candidate runs: the inputs, the weights (copies, by canonical
  name), torch's random draws to replay (or None), which outputs torch
  differentiates with which cotangents, and the trainable parameters
  (the leaves, before the floating inputs)."""

  inputs_torch: list[torch.Tensor]
  values_torch: dict[str, torch.Tensor]
  draws: dict[str, tf.Tensor] | None
  differentiated: list[int]
  cotangents: list[np.ndarray]
  trainable: list[str]


class Results(NamedTuple):
  """A run's flat outputs (in the structure's order), the buffers it
  wrote, and one gradient per leaf (None: zero)."""

  outputs: Sequence[Any]
  writes: Mapping[str, Any]
  grads: Sequence[Any]


def check(
  state: _torch_state.TorchState,
  flat: torch.nn.Module,
  specs: Sequence[tf.TensorSpec],
  program: _export.Program,
  candidate: Callable[[Trial], Results],
  replay_draws: bool = False,
  sizes: Sequence[int] | None = None,
) -> None:
  """Compares `candidate` with torch on random inputs.

  Args:
    state: the module's state (its variables give the weights).
    flat: the module called with the flat tensors (`FlatCall`).
    specs: the call's `tf.TensorSpec`s.
    program: the capture's program (its structure, the buffers it writes).
    candidate: runs the capture on a `Trial`.
    replay_draws: torch runs `program` itself and records its random
      draws for the candidate to replay (a TF translation draws its own).
    sizes: the `_inputs.random_inputs` sizes to check at; by default the
      first, and the second where a dimension is unknown.

  Raises:
    Refusal: what differs (what="check"), or the forward raised.
  """
  trainable = [n for n in state.param_names if state.variables[n].trainable]
  names = state.param_names + state.buffer_names
  dynamic = any(d is None for s in specs for d in s.shape.as_list())
  rng_state = torch.random.get_rng_state()
  try:
    for size in sizes or ((0, 1) if dynamic else (0,)):
      inputs_torch = _inputs.random_inputs(specs, size, seed=1)
      values = {n: torch.from_numpy(np.array(state.variables[n].numpy())) for n in names}
      leaves = {
        n: v.clone().requires_grad_(n in trainable and v.is_floating_point())
        for n, v in values.items()
      }
      inputs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs_torch]
      torch.manual_seed(1234 + size)
      if replay_draws:
        outputs, writes, draws = _run_program(program, inputs, leaves, state.tensor_names)
      else:
        outputs, writes = _run_module(flat, program, inputs, leaves, state.tensor_names)
        draws = None
      differentiated = [k for k, o in enumerate(outputs) if o.requires_grad]
      rng = np.random.default_rng(7 + size)
      cotangents = [
        rng.standard_normal(tuple(outputs[k].shape)).astype(outputs[k].detach().numpy().dtype)
        for k in differentiated
      ]
      torch.manual_seed(1234 + size)
      trial = Trial(inputs_torch, values, draws, differentiated, cotangents, trainable)
      got = candidate(trial)
      where = (
        f"{'second ' if size else ''}random inputs of shapes "
        f"{[list(x.shape) for x in inputs_torch]}"
      )
      for k, (got_k, want) in enumerate(zip(got.outputs, outputs)):
        _compare(got_k, want, f"output {k}", where)
      for n in program_writes(program, state.tensor_names):
        _compare(got.writes[n], writes[n], f"buffer {n!r} written", where)
      if not differentiated:
        continue
      leaves_torch = [leaves[n] for n in trainable] + [x for x in inputs if x.requires_grad]
      grads_torch = torch.autograd.grad(
        [outputs[k] for k in differentiated],
        leaves_torch,
        [torch.from_numpy(c) for c in cotangents],
        allow_unused=True,
      )
      labels = [f"parameter {n!r}" for n in trainable] + [
        f"input {k}" for k, x in enumerate(inputs) if x.requires_grad
      ]
      for label, g_got, g_torch, leaf in zip(labels, got.grads, grads_torch, leaves_torch):
        _compare(
          np.zeros(tuple(leaf.shape), leaf.detach().numpy().dtype) if g_got is None else g_got,
          torch.zeros_like(leaf) if g_torch is None else g_torch,
          f"gradient of {label}",
          where,
          grads=True,
        )
  finally:
    torch.random.set_rng_state(rng_state)


def program_writes(program: _export.Program, state_names: Mapping[str, str]) -> tuple[str, ...]:
  """The canonical names of the buffers `program` writes, in its order."""
  return tuple(state_names[t] for t in program.mutations)


def flat_outputs(structure: Any, result: Any) -> list[Any]:
  """`result`'s tensors in `structure`'s index order."""
  flat_index = tf.nest.flatten(structure)
  by_index = dict(zip(flat_index, tf.nest.flatten(result)))
  return [by_index[i] for i in sorted(flat_index)]


def _run_module(
  flat: torch.nn.Module,
  program: _export.Program,
  inputs: Sequence[torch.Tensor],
  leaves: dict[str, torch.Tensor],
  state_names: Mapping[str, str],
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
  """The module's forward on the trial (its buffers written in `leaves`)."""
  tensors = {f"module.{k}": leaves[c] for k, c in state_names.items()}
  tensors.update({f"module.{k}": v for k, v in leaves.items()})
  try:
    result = torch.func.functional_call(flat, tensors, tuple(inputs))
  except Exception as err:  # the user's forward on random inputs
    raise _refusal.Refusal(
      "check", f"the forward raised on random inputs: {type(err).__name__}: {err}"
    ) from err
  by_index = _export.flatten_like(program.structure, result)
  outputs = [by_index[i] for i in sorted(tf.nest.flatten(program.structure))]
  return outputs, {n: leaves[n] for n in program_writes(program, state_names)}


def _run_program(
  program: _export.Program,
  inputs: Sequence[torch.Tensor],
  leaves: dict[str, torch.Tensor],
  state_names: Mapping[str, str],
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, tf.Tensor]]:
  """The exported program run by torch, recording its random draws."""
  masks: dict[str, torch.Tensor] = {}
  random = set(_fx_to_tf.random_nodes(program.graph))

  class _Recorder(torch.fx.Interpreter):
    def run_node(self, n: torch.fx.Node) -> Any:
      value = super().run_node(n)
      if n.name in random:
        masks[n.name] = value[1].detach()
      return value

  reads = _export.state_reads(program, state_names)
  user = dict(zip(program.user_inputs, inputs))
  args = []
  for node in program.graph.nodes:
    if node.op != "placeholder":
      continue
    if node.name in user:
      args.append(user[node.name])
    elif node.name in reads:
      args.append(leaves[reads[node.name]])
    else:
      args.append(torch.from_numpy(program.constants[node.name]))
  module = torch.fx.GraphModule(torch.nn.Module(), program.graph)
  flat = list(_Recorder(module).run(*args))
  written = program_writes(program, state_names)
  n = len(written)
  draws = {k: tf.constant(v.numpy()) for k, v in masks.items()}
  return flat[n:], dict(zip(written, flat[:n])), draws


def _compare(
  got: Any, want_torch: torch.Tensor, what: str, where: str, grads: bool = False
) -> None:
  got_np = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
  want = want_torch.detach().cpu().numpy()
  if got_np.shape != want.shape:
    raise _refusal.Refusal(
      "check", f"{what} has shape {list(got_np.shape)}, torch's {list(want.shape)} ({where})"
    )
  dtype = tf.as_dtype(got.dtype) if isinstance(got, tf.Tensor) else tf.as_dtype(got_np.dtype)
  found = _tolerance.difference(got_np, want, dtype, grads=grads)
  if not found.ok:
    raise _refusal.Refusal(
      "check",
      f"{what} differs from torch's by up to {found.largest:.3g} (tolerance "
      f"{found.bound:.3g} + {found.tolerance.rtol} x |torch|, {dtype.name}; {where})",
    )
