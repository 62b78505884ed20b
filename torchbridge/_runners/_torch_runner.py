"""The C++ torch runner: graph calls that run torch do it from the op's C++.

Where a module's graph call runs torch (`run="torch"`, or `run="auto"`
where the TF translation does not hold), each call signature is captured
once (the `SharedExport` the TF runner lowered, where it ran first),
lowered to torch's own ops, checked once against torch on random inputs
(`_capture/_parity.py`), and run from the native op's
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
from collections.abc import Mapping, Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge import _call
from torchbridge._capture import _captures
from torchbridge._capture import _parity
from torchbridge._capture import _shared_export
from torchbridge._capture import _watch
from torchbridge._crossing import _stats
from torchbridge._frameworks import _compat
from torchbridge._native import _exported
from torchbridge._native import _exported_program
from torchbridge._native import _loader
from torchbridge._runtime import _placement
from torchbridge._state import _torch_state
from torchbridge._translate import _export
from torchbridge._translate import _refusal

ENV = "TORCHBRIDGE_TORCH_RUNNER"  # "python": graph calls take the Python path


class Program:
  """One captured signature as the C++ runner runs it: the loaded program,
  its output specs and structure.

  The program's arguments: every variable's value (parameters, then
  buffers), the call's tensors, the capture's constant tensors, then
  again each variable the graph reads a second time (a tied weight that
  `torch.export` lifts once per name: TF adds up its two gradients)."""

  def __init__(
    self,
    loaded: _exported_program.ExportedProgram,
    constants_tf: list[tf.Tensor],
    again: list[int],
    out_specs: list[tf.TensorSpec],
    structure: Any,
    mutated: tuple[str, ...],
    check_specs: list[tf.TensorSpec] | None = None,
  ) -> None:
    self.loaded = loaded
    self.constants_tf = constants_tf
    self.again = again  # indices into the variables' values
    self.out_specs = out_specs  # at the call's sizes
    self.check_specs = check_specs or out_specs  # at any batch (its check's)
    self.structure = structure
    self.mutated = mutated
    self.seconds = 0.0  # its capture: export, lowering, loading and check

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

  def call(
    self, arguments: list[tf.Tensor], differentiable: list[bool], name: str, check: bool = False
  ) -> tuple[dict[str, tf.Tensor], list[tf.Tensor]]:
    """The op that runs it: `({buffer written: new value}, flat outputs)`
    (`check`: on its check's trial, of another batch size)."""
    specs = self.check_specs if check else self.out_specs
    outs_tf = _call.call_exported(self.loaded, arguments, specs, differentiable, name)
    n = len(self.mutated)
    return dict(zip(self.mutated, outs_tf[:n])), outs_tf[n:]

  def mismatch(self, output_signature: Any) -> str | None:
    """Why its outputs do not fit the wrapper's `output_signature`, or None."""
    declared = tf.nest.flatten(output_signature)
    outputs = self.out_specs[len(self.mutated) :]
    if len(declared) != len(outputs) or any(
      d.dtype != o.dtype or not d.shape.is_compatible_with(o.shape)
      for d, o in zip(declared, outputs)
    ):
      return (
        f"the capture's outputs {outputs} do not match output_signature "
        f"{output_signature} (the Python path checks each call against it)"
      )
    return None


class TorchRunner:
  """The C++ torch runner's programs of one module, by signature."""

  def __init__(self, state: _torch_state.TorchState) -> None:
    self._state = state
    self.captures: _captures.Captures[Program] = _captures.Captures()
    self.enabled = True  # False: this module's graph calls take the Python path

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

  def entry(
    self, key: Any, shared: _shared_export.SharedExport, training: bool | list[bool]
  ) -> tuple[Program, _watch.Snapshot] | _refusal.Refusal:
    """The signature's program and what it read, or why it has none."""
    # The user's torch thread count (a thread of its own, as the capture's,
    # reads OpenMP's default instead).
    num_threads = torch.get_num_threads()
    return self.captures.get(key, lambda: self._capture(shared, training, num_threads))

  def run(self, program: Program, args_tf: Sequence[tf.Tensor]) -> tuple[Any, dict[str, tf.Tensor]]:
    """The op running `program` in the graph being traced: `(result,
    {buffer name: new value})`."""
    state = self._state
    # Traced into a graph, its calls run on the torch thread: the user's
    # thread's idle OpenMP team is released, as the Python path's tracing
    # does (two teams on these cores slow every parallel region).
    _placement.remember_user_threads()
    _placement.graph_call_traced()
    names = state.param_names + state.buffer_names
    arguments, differentiable = program.arguments(
      _compat.read_values([state.variables[n] for n in names]), state.trainable(), list(args_tf)
    )
    writes, outputs = program.call(arguments, differentiable, state.name)
    return tf.nest.map_structure(lambda i: outputs[i], program.structure), writes

  def _capture(
    self, shared: _shared_export.SharedExport, training: bool | list[bool], num_threads: int
  ) -> tuple[Program, _watch.Snapshot] | _refusal.Refusal:
    made = _captures.capture_held(
      self._state, training, lambda: self._checked(shared, num_threads), "runner"
    )
    shared.to_disk("torch", made if isinstance(made, _refusal.Refusal) else None, decompose=False)
    return made

  def _checked(self, shared: _shared_export.SharedExport, num_threads: int) -> Program:
    state = self._state
    kept = shared.from_disk("torch")  # checked when it was made
    if kept is not None:
      return self._load(kept, shared, num_threads)
    lowered = shared.lowered(decompose=False)
    program = self._load(lowered, shared, num_threads)
    try:
      with _stats.uncounted():  # the check's crossings are no call's
        _parity.check(
          state,
          shared.flat,
          shared.specs,
          lowered,
          lambda trial: _cpp_side(program, state, trial),
          sizes=shared.check_sizes,
        )
    except tf.errors.OpError as err:  # torch raised in the C++ runner's check
      said = torch_message(err.message)
      raise _refusal.Refusal("check", f"the capture's check raised in torch: {said}", said) from err
    return program

  def _load(
    self, lowered: _export.Program, shared: _shared_export.SharedExport, num_threads: int
  ) -> Program:
    """`lowered` loaded into the C++ runner, its arguments in the order
    `Program.arguments` gives them; its output specs at the call's sizes."""
    state = self._state
    specs = shared.specs
    sizes = _shared_export.batch_sizes(lowered, shared.batch)
    names = state.param_names + state.buffer_names
    inputs = [f"torchbridge_unused_{k}" for k in range(len(names))]
    again, again_inputs = [], []
    for placeholder, canonical in _export.state_reads(lowered, state.tensor_names).items():
      k = names.index(canonical)
      if inputs[k].startswith("torchbridge_unused_"):
        inputs[k] = placeholder
      else:  # a tied weight, lifted once per name: passed again
        again.append(k)
        again_inputs.append(placeholder)
    inputs += list(lowered.user_inputs)
    constants = list(lowered.constants)
    inputs += constants + again_inputs
    mutated = _parity.program_writes(lowered, state.tensor_names)
    trainable = state.trainable()
    leaves = (
      trainable
      + [_call.is_differentiable(s.dtype) for s in specs]
      + [False] * len(constants)
      + [trainable[k] for k in again]
    )
    try:
      loaded = _exported_program.ExportedProgram(
        lowered.graph, inputs, len(mutated), leaves, num_threads
      )
    except _exported_program.Unsupported as err:
      raise _refusal.Refusal("runner", f"a node of the capture: {err}") from err
    outputs = [n for n in lowered.graph.nodes if n.op == "output"][0]
    out_specs, check_specs = [], []
    for k, node in enumerate(_exported_program.flat_outputs(outputs.args[0])):
      if k < len(mutated):
        variable = state.variables[mutated[k]]
        out_specs.append(tf.TensorSpec(variable.shape, variable.dtype))
        check_specs.append(out_specs[-1])
      else:
        out_specs.append(spec_of(node, state.name, sizes))
        check_specs.append(spec_of(node, state.name))
    constants_tf = [tf.constant(lowered.constants[c]) for c in constants]
    return Program(loaded, constants_tf, again, out_specs, lowered.structure, mutated, check_specs)


def _cpp_side(
  program: Program, state: _torch_state.TorchState, trial: _parity.Trial
) -> _parity.Results:
  """The program on a trial, as a graph call runs it (its two ops, eagerly)."""
  names = state.param_names + state.buffer_names
  vars_tf = [tf.constant(trial.values_torch[n].numpy()) for n in names]
  args_tf = [tf.constant(x.numpy()) for x in trial.inputs_torch]
  leaves_tf = [vars_tf[names.index(n)] for n in trial.trainable] + [
    a for a in args_tf if a.dtype.is_floating
  ]
  arguments, differentiable = program.arguments(vars_tf, state.trainable(), args_tf)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(leaves_tf)
    writes, outputs = program.call(arguments, differentiable, state.name, check=True)
  grads: list[Any] = [None] * len(leaves_tf)
  if trial.differentiated and leaves_tf:
    grads = tape.gradient(
      [outputs[k] for k in trial.differentiated],
      leaves_tf,
      output_gradients=[tf.constant(c) for c in trial.cotangents],
    )
  return _parity.Results(outputs, writes, grads)


def torch_message(message: str) -> str:
  """torch's own words in the op's error (not TF's function names, not
  torch's C++ stack)."""
  marker = "its C++ callback failed: "
  if marker in message:
    message = message[message.index(marker) + len(marker) :]
  for end in ("\nException raised from", "Exception raised from", " [Op:"):
    if end in message:
      message = message[: message.index(end)]
  return message.strip()


def spec_of(node: Any, name: str, sizes: Mapping[Any, int] | None = None) -> tf.TensorSpec:
  """The `tf.TensorSpec` of an output node of the program (`sizes`: values
  of the symbols its dimensions are known at)."""
  value = node.meta.get("val") if hasattr(node, "meta") else None
  if not isinstance(value, torch.Tensor):
    raise _refusal.Refusal("runner", f"the forward returns {value!r}, not a tensor")
  shape = _shared_export.dims_at(value.shape, sizes or {})
  try:
    dtype = tf.as_dtype(torch.empty((), dtype=value.dtype).numpy().dtype)
  except TypeError as err:
    raise _refusal.Refusal(
      "runner", f"{name} returns a {value.dtype} tensor, which TF has no dtype for"
    ) from err
  return tf.TensorSpec(shape, dtype)
