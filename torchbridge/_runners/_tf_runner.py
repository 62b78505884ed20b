"""The TF runner: a graph call as the exact TF translation of its capture.

Each call signature's `SharedExport` is lowered to the ATen ops the
translation knows, translated node by node (`_translate/_fx_to_tf.py`)
and checked against torch (`_capture/_parity.py`; a translation that draws
random numbers replays torch's draws there, and its own are checked by
their keep rate). The translation then runs as TF ops in the caller's
graph, reading the module's variables; buffers it writes are assigned
to theirs. Where it cannot (an op without a translation, torch.export's
refusal, a failed check), the signature's `Refusal` is kept and the
dispatch (`_choose.py`) takes torch.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._capture import _captures
from torchbridge._capture import _parity
from torchbridge._capture import _shared_export
from torchbridge._capture import _watch
from torchbridge._state import _torch_state
from torchbridge._translate import _decompose
from torchbridge._translate import _export
from torchbridge._translate import _fx_to_tf
from torchbridge._translate import _inputs
from torchbridge._translate import _refusal
from torchbridge._translate import _errors


class Translation:
  """A captured call as TF ops: `run(args_tf)` builds them in the caller's
  graph and returns `(result, {buffer name: new value})`."""

  def __init__(
    self,
    program: _export.Program,
    variables: Mapping[str, tf.Variable],
    state_names: Mapping[str, str],
  ) -> None:
    self.program = program
    self._variables = variables  # by canonical name
    self._reads = _export.state_reads(program, state_names)  # placeholder -> canonical
    self.mutated = _parity.program_writes(program, state_names)
    self.random = bool(_fx_to_tf.random_nodes(program.graph))
    self.seconds = 0.0  # its capture: export, translation and check

  def run(
    self,
    args_tf: Sequence[tf.Tensor],
    draws: Mapping[str, Any] | None = None,
    drawn: dict[str, Any] | None = None,
  ) -> tuple[Any, dict[str, tf.Tensor]]:
    values: dict[str, Any] = dict(zip(self.program.user_inputs, args_tf))
    values.update({p: tf.convert_to_tensor(self._variables[n]) for p, n in self._reads.items()})
    values.update({n: tf.constant(c) for n, c in self.program.constants.items()})
    flat_tf = _fx_to_tf.run(self.program.graph, values, draws, drawn)
    n = len(self.mutated)
    outputs = flat_tf[n:]
    result = tf.nest.map_structure(lambda i: outputs[i], self.program.structure)
    return result, dict(zip(self.mutated, flat_tf[:n]))


class TFRunner:
  """The TF runner's translations of one module, by signature."""

  def __init__(self, state: _torch_state.TorchState) -> None:
    self._state = state
    self.captures: _captures.Captures[Translation] = _captures.Captures()

  def entry(
    self, key: Any, shared: _shared_export.SharedExport, training: bool | list[bool]
  ) -> tuple[Translation, _watch.Snapshot] | _refusal.Refusal:
    """The signature's translation and what it read, or why it has none."""
    return self.captures.get(key, functools.partial(self._capture, shared, training))

  def run(
    self, translation: Translation, args_tf: Sequence[tf.Tensor]
  ) -> tuple[Any, dict[str, tf.Tensor]]:
    """The translation's ops in the graph being traced, under the module's
    name scope (as a Keras layer's ops are named: `actor/MatMul` in TF's
    profiler and TensorBoard)."""
    with _name_scope(self._state.name):
      return translation.run(args_tf)

  def refusal_error(self, refusal: _refusal.Refusal) -> Exception:
    """The error a run="tf" graph call raises for `refusal`."""
    message = (
      f'{self._state.name} (run="tf"): its graph calls cannot run as TF ops: {refusal.said()}\n'
      'run="auto" runs them in torch through the bridge instead (run="torch" always does).'
    )
    if refusal.what == "op":
      return _in_graph(_errors.UntranslatedOpsError)(message)
    if refusal.what == "check":
      return _errors.ParityError(message)
    return ValueError(message)

  def _capture(
    self, shared: _shared_export.SharedExport, training: bool | list[bool]
  ) -> tuple[Translation, _watch.Snapshot] | _refusal.Refusal:
    # Anything that raises in capturing (TF's own gradient code included)
    # is a limit of the translation: this call takes torch.
    made = _captures.capture_held(
      self._state, training, functools.partial(self._translate, shared), "translation"
    )
    shared.to_disk("tf", made if isinstance(made, _refusal.Refusal) else None, decompose=True)
    return made

  def _translate(self, shared: _shared_export.SharedExport) -> Translation:
    state = self._state
    kept = shared.from_disk("tf")  # checked when it was made
    if kept is not None:
      return Translation(kept, state.plain_variables(), state.tensor_names)
    # Refused before decomposing where an op kept whole refuses (BERT's
    # attention with dropout: its decomposition cost 4.6 s for nothing).
    _refuse_ops(_fx_to_tf.untranslated(shared.exported().graph, only=_decompose.stays_whole))
    program = shared.lowered(decompose=True)
    _refuse_ops(_fx_to_tf.untranslated(program.graph))
    translation = Translation(program, state.plain_variables(), state.tensor_names)
    _parity.check(
      state,
      shared.flat,
      shared.specs,
      program,
      functools.partial(_translated_side, translation, state),
      replay_draws=translation.random,
      sizes=shared.check_sizes,
    )
    if translation.random:
      _check_draws(translation, shared.specs)
    return translation


def _refuse_ops(missing: Mapping[str, str]) -> None:
  if missing:
    raise _refusal.Refusal("op", "; ".join(f"{op}: {why}" for op, why in sorted(missing.items())))


def _translated_side(
  translation: Translation, state: _torch_state.TorchState, trial: _parity.Trial
) -> _parity.Results:
  """The translation on a trial, as a graph call runs it: traced by
  get_concrete_function, then called (TF's eager gradients of some ops, a
  3-D convolution's among them, fail for want of attributes; a new
  tf.function called per check would make TF warn of "frequent
  retracing" from the fifth capture of a process on)."""
  args_tf = [tf.constant(x.numpy()) for x in trial.inputs_torch]
  variables = state.plain_variables()
  leaves_tf = [variables[n] for n in trial.trainable] + [a for a in args_tf if a.dtype.is_floating]

  def tf_side() -> tuple[list[tf.Tensor], dict[str, tf.Tensor], list[Any]]:
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(leaves_tf)
      result_tf, writes_tf = translation.run(args_tf, trial.draws)
      outputs_tf = _parity.flat_outputs(translation.program.structure, result_tf)
    if not trial.differentiated:
      return outputs_tf, writes_tf, []
    grads = tape.gradient(
      [outputs_tf[k] for k in trial.differentiated],
      leaves_tf,
      output_gradients=[
        tf.constant(c, outputs_tf[k].dtype) for k, c in zip(trial.differentiated, trial.cotangents)
      ],
    )
    return (
      outputs_tf,
      writes_tf,
      [
        tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, leaves_tf)
      ],
    )

  outputs, writes, grads = tf.function(tf_side, autograph=False).get_concrete_function()()
  return _parity.Results(outputs, writes, grads)


def _check_draws(translation: Translation, specs: Sequence[tf.TensorSpec]) -> None:
  """TF's own random draws: each dropout keeps 1 - p of its elements."""
  args_tf = [tf.constant(x.numpy()) for x in _inputs.random_inputs(specs, 0, seed=3)]
  drawn: dict[str, Any] = {}
  translation.run(args_tf, drawn=drawn)
  nodes = {n.name: n for n in translation.program.graph.nodes}
  for node_name, mask in drawn.items():
    p = float(nodes[node_name].args[1])
    count = int(tf.size(mask))
    if count == 0 or p in (0.0, 1.0):
      continue
    kept = float(tf.reduce_mean(tf.cast(mask, tf.float64)))
    bound = 6 * math.sqrt(p * (1 - p) / count) + 1e-9
    if abs(kept - (1 - p)) > bound:
      raise _refusal.Refusal(
        "check",
        f"dropout {node_name!r} kept {kept:.3f} of {count} elements where "
        f"torch keeps {1 - p:.3f} (bound {bound:.3f})",
      )


@functools.cache
def _in_graph(error_type: type[Exception]) -> type[Exception]:
  """`error_type` with Exception's own __init__: AutoGraph re-raises such
  an error from a `tf.function` as itself, not as a StagingError."""
  return type(error_type.__name__, (error_type,), {"__init__": Exception.__init__})


def _name_scope(name: str) -> Any:
  """The module's name scope; none where the caller's scope ends with that
  name already (Keras opens a layer's)."""
  scope = tf.compat.v1.get_default_graph().get_name_scope()
  if re.fullmatch(re.escape(name) + r"(_\d+)?", scope.rsplit("/", 1)[-1]):
    return contextlib.nullcontext()
  # A root scope may not start with "_" (a valid tf.Module name may).
  return tf.name_scope(re.sub(r"^[^A-Za-z0-9.]+", "", name) or "torch_module")
