"""`translate`: a TorchModule as pure TF ops reading the same variables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._translate import _errors
from torchbridge._translate import _export
from torchbridge._translate import _fx_to_tf
from torchbridge._translate import _inputs
from torchbridge._translate import _refusal
from torchbridge._translate import _tolerance


class Translated(tf.Module):
  """A translated torch module: pure TF ops reading the bridge's variables.

  Made by `translate`, not constructed directly. Call it like the torch
  module, with tensors that match `input_signature`; `__call__` is a
  `tf.function` (save it with `tf.saved_model.save`; it becomes the
  `serving_default` signature). Its `variables` are the wrapped module's,
  tracked under the torch state_dict names, so a checkpoint of either has
  the same keys.

  Attributes:
    parity: the largest absolute difference from torch per output (a
      tuple of floats, in torch's flattening order) on the example input
      checked at translation.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> served = tb.translate(tb.TorchModule(torch.nn.Linear(3, 2)),
    ...                       [tf.TensorSpec([None, 3], tf.float32)])
    >>> served(tf.ones([4, 3])).shape.as_list()
    [4, 2]
    >>> len(served.parity), served.parity[0] < 1e-5
    (1, True)
  """

  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
    (
      "_graph",
      "_structure",
      "_user_inputs",
      "_constants",
      "_state_inputs",
      "_input_signature",
      "_jit_compile",
      "parity",
    )
  ).union(tf.Module._TF_MODULE_IGNORED_PROPERTIES)

  def __init__(
    self,
    program: _export.Program,
    variables: dict[str, tf.Variable],
    input_signature: Sequence[tf.TensorSpec],
    name: str,
    jit_compile: bool | None,
  ) -> None:
    super().__init__(name=name)
    self._graph = program.graph
    self._structure = program.structure
    self._user_inputs = program.user_inputs
    self._constants = program.constants
    self._state_inputs = program.state_inputs  # placeholder -> torch name
    # Tracked under the torch state_dict names, as TorchModule's variables
    # are: a checkpoint of either has the same keys.
    self._tf_variables = variables
    self.parity: tuple[float, ...] = ()
    self._input_signature, self._jit_compile = tuple(input_signature), jit_compile

    def call(*inputs_tf: tf.Tensor) -> Any:  # one Python function per module: TF's retracing
      return self._run(*inputs_tf)  # warning counts traces per function

    # The instance's tf.function hides the method on purpose (`__call__`
    # reaches it through `__dict__`, and SavedModel saves it).
    self.__call__ = tf.function(  # type: ignore[method-assign]
      call, input_signature=input_signature, jit_compile=jit_compile, autograph=False
    )

  def __call__(self, *args: Any) -> Any:  # pylint: disable=method-hidden
    """Runs the translated graph: pure TF ops, no torch.

    Args:
      *args: one tensor (or array) per spec of `input_signature`.

    Returns:
      The forward's result, in the torch module's structure, as TF tensors.

    Raises:
      TypeError: the number of inputs, or an input's dtype or shape, does
        not match `input_signature`.
    """
    if tf.inside_function() and not self._jit_compile:
      # In the caller's graph the ops go in directly, not as a nested
      # function call: a nested function that transposes a variable (every
      # convolution's weight) makes XLA recompile a jit-compiled training
      # step on every call (TF 2.21).
      return self._run(*self._checked(args))
    return self.__dict__["__call__"](*args)

  def _checked(self, args: Sequence[Any]) -> list[tf.Tensor]:
    """`args` as tensors of the input signature, as the tf.function does."""
    if len(args) != len(self._input_signature):
      raise TypeError(
        f"{self.name}: expected {len(self._input_signature)} "
        f"input(s) ({self._input_signature}), got {len(args)}"
      )
    inputs_tf = []
    for k, (arg, spec) in enumerate(zip(args, self._input_signature)):
      x_tf = tf.convert_to_tensor(arg, dtype_hint=spec.dtype)
      if not spec.is_compatible_with(x_tf):
        raise TypeError(
          f"{self.name}: input {k} is {x_tf.dtype.name} "
          f"{x_tf.shape}, which does not match its input_signature "
          f"{spec}; cast or reshape it to match."
        )
      inputs_tf.append(x_tf)
    return inputs_tf

  def _run(self, *inputs_tf: tf.Tensor) -> Any:
    values = dict(zip(self._user_inputs, inputs_tf))
    values.update(
      {
        placeholder: tf.convert_to_tensor(self._tf_variables[name])
        for placeholder, name in self._state_inputs.items()
      }
    )
    values.update({n: tf.constant(c) for n, c in self._constants.items()})
    flat_tf = _fx_to_tf.run(self._graph, values)
    return tf.nest.map_structure(lambda i: flat_tf[i], self._structure)


def translate(
  module: Any,
  input_signature: Sequence[tf.TensorSpec],
  *,
  example_inputs: Sequence[Any] | None = None,
  rtol: float | None = None,
  atol: float | None = None,
  jit_compile: bool | None = None,
  name: str | None = None,
) -> Translated:
  """Translates a `TorchModule` (or `TorchLayer`) into pure TF ops.

  The torch module is exported with `torch.export` in eval mode (dropout
  off, BatchNorm reading its running statistics), with a dynamic size for
  every `None` of `input_signature`; each ATen op of the exported graph
  becomes TF ops that read the **same** variables as `module` (no copy of
  the weights: what TF trained through the bridge is what is served, and
  later `assign`s are seen too). The result runs without torch: eagerly,
  in `tf.function`, with `jit_compile=True`, in a SavedModel, in TFLite.

  Translation checks itself: it runs torch and the TF graph on an example
  input (`example_inputs`, or random values of `input_signature` with batch
  size 2) and raises `ParityError` if an output differs by more than
  `atol + rtol * |torch|`; the largest differences are kept in `.parity`.

  Args:
    module: a `tb.TorchModule` or `tb.keras.TorchLayer`.
    input_signature: a list of `tf.TensorSpec`, one per positional input of
      the torch forward.
    example_inputs: optional list of arrays or tensors (one per spec) for
      the export and the parity check; needed where random values do not
      fit the model (e.g. token ids below the vocabulary size: the default
      ids are 0 and 1).
    rtol: the parity tolerance, relative; default by dtype (float32: 1e-5,
      float64: 1e-10).
    atol: the parity tolerance, absolute; default by dtype (float32: 1e-6,
      float64: 1e-10).
    jit_compile: passed to the `tf.function` of `__call__`.
    name: the `tf.Module` name; default `<module name>_translated`.

  Returns:
    A `Translated` `tf.Module` whose `variables` are `module`'s.

  Raises:
    UntranslatedOpsError: ops of the model have no translation (all named).
    ParityError: the TF graph differs from torch beyond the tolerance.
    TypeError: `module` is not a `tb.TorchModule` or `tb.keras.TorchLayer`,
      or `input_signature` is not a list of `tf.TensorSpec`.
    ValueError: a spec of unknown rank; `example_inputs` that do not match
      `input_signature`; `torch.export` could not export the module, or
      fixed a dimension the signature leaves dynamic; or the forward writes
      buffers in eval mode.
    RuntimeError: the translation of an op failed on this model (a bug of
      the translation, to report).

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> actor = tb.TorchModule(torch.nn.Sequential(
    ...     torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
    >>> served = tb.translate(actor, [tf.TensorSpec([None, 3], tf.float32)])
    >>> served(tf.ones([5, 3])).shape.as_list()
    [5, 2]
    >>> all(a is b for a, b in zip(sorted(served.variables, key=id),
    ...                            sorted(actor.variables, key=id)))
    True
  """
  state, module_name = _torch_state_of(module)
  specs = _inputs.check_signature(input_signature)
  torch_module = module.torch_module
  modes = {m: m.training for m in torch_module.modules()}
  torch_module.eval()
  try:
    examples_torch = _inputs.example_inputs(specs, example_inputs)
    program = _export.export(torch_module, specs, examples_torch, module_name)
    missing = _fx_to_tf.untranslated(program.graph)
    if missing:
      ops = "\n".join(f"  {op}: {why}" for op, why in sorted(missing.items()))
      raise _errors.UntranslatedOpsError(
        _errors.UNTRANSLATED.format(name=module_name, count=len(missing), ops=ops), missing
      )
    try:
      reads = _export.state_reads(program, state.tensor_names)
    except _refusal.Refusal as err:
      raise ValueError(
        f"translate({module_name!r}): {err.reason}: translation needs every tensor the "
        "forward reads registered."
      ) from None
    plain = state.plain_variables()
    variables = {program.state_inputs[p]: plain[name] for p, name in reads.items()}
    served = Translated(program, variables, specs, name or f"{module_name}_translated", jit_compile)
    with torch.no_grad():
      expected_torch = torch_module(*examples_torch)
  finally:
    for m, training in modes.items():
      m.train(training)
  try:
    result_tf = served(*[tf.constant(e.numpy()) for e in examples_torch])
  except _refusal.Refusal as err:  # "<op> (node ...): <reason>"
    if err.what != "op":
      raise RuntimeError(_errors.FAILED.format(name=module_name, error=err)) from err
    op, _, why = err.reason.partition(": ")
    raise _errors.UntranslatedOpsError(
      _errors.UNTRANSLATED.format(name=module_name, count=1, ops=f"  {err}"), {op: why}
    ) from err
  served.parity = _check_parity(
    program.structure, result_tf, expected_torch, rtol, atol, module_name
  )
  return served


def _torch_state_of(module: Any) -> tuple[Any, str]:
  state = getattr(module, "_state", None) or getattr(module, "_torch_state", None)
  if state is None or not hasattr(module, "torch_module"):
    raise TypeError(
      f"translate(module): expected a tb.TorchModule or tb.keras.TorchLayer, "
      f"got {type(module).__name__}. Wrap a torch module first: "
      f"translate(tb.TorchModule(torch_module), input_signature=...)."
    )
  return state, module.name


def _check_parity(
  structure: Any,
  result_tf: Any,
  expected_torch: Any,
  rtol: float | None,
  atol: float | None,
  name: str,
) -> tuple[float, ...]:
  flat_index = tf.nest.flatten(structure)
  flat_tf = dict(zip(flat_index, tf.nest.flatten(result_tf)))
  flat_torch = _export.flatten_like(structure, expected_torch)
  rows, parity, failed = [], [], False
  for i in range(len(flat_tf)):
    default = _tolerance.tolerance_of(flat_tf[i].dtype)
    given = _tolerance.Tolerance(
      default.rtol if rtol is None else rtol, default.atol if atol is None else atol
    )
    want = flat_torch[i].detach().cpu().numpy()
    found = _tolerance.difference(
      flat_tf[i].numpy(), want, flat_tf[i].dtype, given=given, scaled=False
    )
    failed |= not found.ok
    parity.append(found.largest)
    rows.append(
      f"  output {i}: {found.largest:.3g} (shape {list(want.shape)}, "
      f"{flat_tf[i].dtype.name}, rtol={given.rtol}, atol={given.atol})"
      f"{'' if found.ok else '  <- over tolerance'}"
    )
  if failed:
    raise _errors.ParityError(_errors.MISMATCH.format(name=name, rows="\n".join(rows)))
  return tuple(parity)
