"""The C++ torch runner: graph calls that run torch do it from the op's C++.

Where a module's graph call runs torch (`run="torch"`, or `run="auto"`
where the TF translation does not hold), each call signature is captured
once with `torch.export` (the capture the TF runner uses, with the same
key and the same watch on Python state, `_watch.py`), checked once
against the Python path on random inputs, and run from the native op's
CPU kernel (`_native/_exported.py`): one boxed dispatcher call per ATen
node, autograd recorded as eager torch records it, no GIL and no Python
per call. Where it cannot (a capture torch refuses, a node the runner
cannot call, a failed check, a GPU, a replica of a `tf.distribute`
strategy, the native op without torch's side), the call takes the Python
path, said once at WARNING with the reason.

`TORCHBRIDGE_TORCH_RUNNER=python` (read when traced) sends every such call
down the Python path: the forward's Python on every call.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge import _call
from torchbridge._crossing import _stats
from torchbridge._frameworks import _compat
from torchbridge._native import _exported
from torchbridge._native import _exported_program
from torchbridge._native import _loader
from torchbridge._runtime import _placement
from torchbridge._runtime import _runners
from torchbridge._state import _capturing
from torchbridge._state import _distribute
from torchbridge._state import _guard
from torchbridge._state import _torch_check

_LOG = logging.getLogger("torchbridge")

ENV = "TORCHBRIDGE_TORCH_RUNNER"  # "python": graph calls take the Python path


class _Captured:
  """One captured signature: the program, its output specs and structure.

  The program's arguments: every variable's value (parameters, then
  buffers), the call's tensors, the capture's constant tensors, then
  again each variable the graph reads a second time (a tied weight that
  `torch.export` lifts once per name: TF adds up its two gradients)."""

  def __init__(
    self,
    program: _exported_program.ExportedProgram,
    constants_tf: list[tf.Tensor],
    again: list[int],
    out_specs: list[tf.TensorSpec],
    structure: Any,
    mutated: tuple[str, ...],
    seconds: float,
  ) -> None:
    self.program = program
    self.constants_tf = constants_tf
    self.again = again  # indices into the variables' values
    self.out_specs = out_specs
    self.structure = structure
    self.mutated = mutated
    self.seconds = seconds

  def arguments(
    self, vars_tf: list[tf.Tensor], vars_differentiable: list[bool], args_tf: list[tf.Tensor]
  ) -> tuple[list[tf.Tensor], list[bool]]:
    """The program's arguments and which get gradients."""
    return (
      vars_tf + args_tf + self.constants_tf + [vars_tf[k] for k in self.again],
      vars_differentiable
      + [_call.is_differentiable(a.dtype) for a in args_tf]
      + [False] * len(self.constants_tf)
      + [vars_differentiable[k] for k in self.again],
    )


class TorchRunner:
  """The C++ torch runner's captures of one module, by signature."""

  def __init__(self, state: Any) -> None:
    self._state = state
    self._captures: dict[Any, Any] = {}  # key -> (_Captured, Snapshot) or reason
    self._said: set[str] = set()
    self.enabled = True  # False: this module's graph calls take the Python path

  def export_refused(self, key: Any, reason: str, detail: str) -> None:
    """The TF runner saw torch.export refuse `key`: taken, not exported again."""
    reason = f"torch.export could not capture the forward: {reason}"
    self._captures[key] = _torch_check.Refused(reason, detail)

  def why_not(self, args_tf: Sequence[tf.Tensor], in_replica: bool) -> tuple[str, int] | None:
    """Why this graph call takes the Python path (before any capture), and
    the level to say it at; or None. The user's own choices and the
    native op's fallback (which warns once itself) are said at DEBUG."""
    if os.environ.get(ENV, "").lower() == "python":
      return f"{ENV}=python", logging.DEBUG
    if not self.enabled:
      return "the C++ runner is turned off for this module", logging.DEBUG
    if in_replica:
      return "it runs in a replica of a tf.distribute strategy", logging.INFO
    if not _loader.has_torch_interop():
      return f"the complete native op is not loaded ({_loader.status()})", logging.DEBUG
    if tf.config.list_logical_devices("GPU"):
      return "a GPU is visible (the C++ runner runs in the op's CPU kernel only)", logging.INFO
    for arg in args_tf:
      if arg.shape.rank is None:
        return (
          "an argument has an unknown rank while tracing; give the tf.function "
          "an input_signature with known ranks",
          logging.WARNING,
        )
    unavailable = _exported.unavailable()  # builds the library on first use
    return None if unavailable is None else (unavailable, logging.WARNING)

  def call_or_none(
    self,
    call: Any,
    training: bool | list[bool],
    mode_key: str,
    mutated_buffers: dict[str, frozenset[str]],
    after_writes: list[Any] | None,
    output_signature: Any,
  ) -> Any:
    """The graph call's result, its op running the captured program in C++
    (the buffers it writes assigned to their variables); None where the
    call takes the Python path (said once)."""
    state = self._state
    names = state.param_names + state.buffer_names
    why_not = self.why_not(call.args_tf, _distribute.in_replica_of_several())
    if why_not is not None:
      self._say_python(*why_not)
      return None
    key = _capturing.signature_key(call, training, mode_key)
    # The user's torch thread count (a thread of its own, as the capture's,
    # reads OpenMP's default instead).
    num_threads = torch.get_num_threads()
    entry = _capturing.cached_capture(
      self._captures, key, self._capture, call, training, num_threads
    )
    if isinstance(entry, _torch_check.Refused):
      self._say_python(entry.reason, detail=entry.detail)
      return None
    captured, snapshot = entry
    if output_signature is not None:
      mismatch = _torch_check.signature_mismatch(output_signature, captured)
      if mismatch:
        self._say_python(mismatch)
        return None
    _runners.record(state.name, "torch", self._why_torch(), captured.seconds, path="C++")
    self._say_cpp()
    _guard.add_guard(snapshot, state.name, state.take_views_back)
    # Traced into a graph, its calls run on the torch thread: the user's
    # thread's idle OpenMP team is released, as the Python path's tracing
    # does (two teams on these cores slow every parallel region).
    _placement.remember_user_threads()
    _placement.graph_call_traced()
    arguments, differentiable = captured.arguments(
      _compat.read_values([state.variables[n] for n in names]),
      _torch_check.trainable_of(state),
      list(call.args_tf),
    )
    outs_tf = _call.call_exported(
      captured.program, arguments, captured.out_specs, differentiable, state.name
    )
    n = len(captured.mutated)
    _capturing.assign_writes(
      state, dict(zip(captured.mutated, outs_tf[:n])), mutated_buffers, mode_key, after_writes
    )
    outputs = outs_tf[n:]
    return tf.nest.map_structure(lambda i: outputs[i], captured.structure)

  def _capture(self, call: Any, training: bool | list[bool], num_threads: int) -> Any:
    """(_Captured, Snapshot), or why the signature takes the Python path
    (`_torch_check.Refused`)."""
    state = self._state
    start = time.perf_counter()
    specs = [tf.TensorSpec(a.shape, a.dtype) for a in call.args_tf]
    with _capturing.Capturing(state, training) as held:
      try:
        captured = self._export(call, specs, num_threads)
        with _stats.uncounted():  # the check's crossings are no call's
          _torch_check.check(captured, state, call, specs)
        changed = held.changed()
        if changed is not None:
          return _torch_check.Refused(changed)
      except _torch_check.Refused as refused:
        return refused
      except tf.errors.OpError as err:  # torch raised in the C++ runner's check
        said = _torch_check.torch_message(err.message)
        return _torch_check.Refused(f"the capture's check raised in torch: {said}", said)
      except Exception as err:  # pylint: disable=broad-except
        return _torch_check.Refused(
          f"the capture raised {type(err).__name__}: {err}", f"{type(err).__name__}: {err}"
        )
    snapshot = held.after
    captured.seconds = time.perf_counter() - start
    return captured, snapshot

  def _export(self, call: Any, specs: list[tf.TensorSpec], num_threads: int) -> _Captured:
    from torchbridge._translate import _capture  # torch.export: on first use
    from torchbridge._translate import _export

    state = self._state
    flat = _capture.FlatCall(state.module, call.substitute)
    examples = _export.random_inputs(specs, 0, seed=0)
    try:
      program = _export.export(
        flat, specs, examples, state.name, allow_writes=True, varargs=True, decompose=False
      )
    except ValueError as err:
      raise _torch_check.Refused(
        f"torch.export could not capture the forward: {getattr(err, 'summary', err)}",
        getattr(err, "detail", ""),
      ) from err
    canonical = {n: n for n in state.variables}
    canonical.update(state.state_names)
    names = state.param_names + state.buffer_names
    inputs = [f"torchbridge_unused_{k}" for k in range(len(names))]
    again, again_inputs = [], []
    for placeholder, target in program.state_inputs.items():
      inner = _capture.inner_name(target)
      if inner not in canonical:
        raise _torch_check.Refused(
          f"the forward reads the tensor {inner!r}, which is not a parameter or "
          "buffer of the module (register it with register_buffer)"
        )
      k = names.index(canonical[inner])
      if inputs[k].startswith("torchbridge_unused_"):
        inputs[k] = placeholder
      else:  # a tied weight, lifted once per name: passed again
        again.append(k)
        again_inputs.append(placeholder)
    inputs += list(program.user_inputs)
    constants = list(program.constants)
    inputs += constants + again_inputs
    mutated = tuple(canonical[_capture.inner_name(t)] for t in program.mutations)
    trainable = _torch_check.trainable_of(state)
    leaves = (
      trainable
      + [_call.is_differentiable(s.dtype) for s in specs]
      + [False] * len(constants)
      + [trainable[k] for k in again]
    )
    try:
      loaded = _exported_program.ExportedProgram(
        program.graph, inputs, len(mutated), leaves, num_threads
      )
    except _exported_program.Unsupported as err:
      raise _torch_check.Refused(f"the C++ runner cannot run a node of the capture: {err}") from err
    outputs = [n for n in program.graph.nodes if n.op == "output"][0]
    out_specs = []
    for k, node in enumerate(_exported_program.flat_outputs(outputs.args[0])):
      if k < len(mutated):
        variable = state.variables[mutated[k]]
        out_specs.append(tf.TensorSpec(variable.shape, variable.dtype))
      else:
        out_specs.append(_torch_check.spec_of(node, state.name))
    constants_tf = [tf.constant(program.constants[c]) for c in constants]
    return _Captured(loaded, constants_tf, again, out_specs, program.structure, mutated, 0.0)

  def _why_torch(self) -> str:
    """Why the call runs torch: run="torch", or the TF runner's refusal."""
    if self._state.runner is None:
      return "run='torch'"
    return str(_runners.choices().get(self._state.name, {}).get("reason", ""))

  def _say_cpp(self) -> None:
    """Says once, at INFO, that this module's graph calls run on the C++
    torch runner, for run="torch" (run="auto" says it when it falls back)."""
    if "C++" in self._said or self._state.runner is not None:
      return
    self._said.add("C++")
    _LOG.info(
      "torchbridge: %s: graph calls run torch from C++ (the C++ torch runner: a "
      "torch.export capture per signature, no Python per call; %s).",
      self._state.name,
      self._why_torch(),
    )

  def _say_python(self, reason: str, level: int = logging.WARNING, detail: str = "") -> None:
    name = self._state.name
    why = self._why_torch()
    _runners.record(name, "torch", why, path="Python", path_reason=reason, detail=detail)
    _runners.say_once(
      self._said,
      level,
      f"torchbridge: {name}: graph calls run torch on the Python path (the forward's "
      f"Python on every call), not the C++ runner: {_runners.one_line(reason).rstrip('.')}.",
      detail,
    )
