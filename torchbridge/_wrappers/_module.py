"""`TorchModule`: a torch `nn.Module` whose state lives in TF variables."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge import _call
from torchbridge import _runners
from torchbridge._state import _module_checks
from torchbridge._state import _torch_state


class TorchModule(tf.Module):
  """A torch `nn.Module` as a `tf.Module`, its state held by TF variables.

  Each parameter and buffer of the torch module gets one `tf.Variable`,
  named after its torch path (`actor/l1.weight`); the variables are the
  truth. Each call hands torch zero-copy views of their current values
  (swapped into the module for the call, as `torch.func.functional_call`
  does), so any TF optimizer, `assign` or checkpoint restore is seen by the
  next call, and nothing is copied per step. Buffers that torch updates in
  the forward (BatchNorm running statistics, counters) are written back to
  their variables.

  Calls work eagerly and inside `tf.function`, with the gradient behaviour of
  `tb.torch_function`: gradients reach the floating inputs and the trainable
  variables (parameters with `requires_grad=True`); frozen parameters and
  buffers get none.

  `training=True/False` puts the torch module (and every submodule) in
  train or eval mode for that call only; `training=None` leaves torch's own
  mode as it is (inside `tf.function`: the modes the submodules had when the
  function was traced; once one is switched, that graph raises
  `StaleCaptureError` naming the switch rather than run the old mode).

  Inside `tf.function`, the output shapes are found while tracing: on meta
  tensors (nothing computed), else by running the forward on stand-in
  values of the traced shapes (for code that reads values, as Hugging
  Face models' masking does); or they are declared (`output_signature`).

  **Runners.** Graph calls (inside `tf.function`) take one of two runners,
  chosen by `run=`. `"auto"` (the default): each call signature (shapes,
  dtypes, non-tensor arguments, torch modes) is captured once with
  `torch.export`, in the module's current mode (training-mode dropout and
  BatchNorm included), translated to TF ops and checked against torch on
  random inputs (outputs, written buffers, and the gradients of every
  floating input and trainable parameter); it then runs as those TF ops,
  reading the same variables, so TF's autodiff gives the gradients and
  the call is an ordinary part of the graph (XLA, SavedModel, TF's device
  placement). Where an op has no translation or the check fails, the call
  runs torch through the bridge, said once at INFO (logger "torchbridge").
  `"tf"`: the translation or an error. `"torch"`: always torch.
  Eager calls always run torch. Dropout in a translated call draws from
  TF's random stream (the same keep rate, not torch's draws). A plain
  Python attribute the forward read (an exploration scale, a flag) is
  baked into a capture: a later trace captures again if it changed, and a
  graph traced before the change raises `StaleCaptureError` (a
  `RuntimeError`) naming it (what is watched: the `tb.TorchModule` guide).

  Graph calls that run torch run from C++ with no Python per call where
  they can (each signature captured once with `torch.export`, checked
  against the Python path); elsewhere (a refused capture, a GPU, a replica,
  no native op) they run the forward's Python on every call, said once (a
  refused capture at WARNING, a GPU or a replica at INFO);
  `TORCHBRIDGE_TORCH_RUNNER=python` asks for that path.

  Args:
    module: the torch `nn.Module` to wrap, every parameter and buffer
      initialized (not lazy, not on the meta device). Its parameters and
      buffers give the variables their initial values.
    name: the `tf.Module` name, which prefixes every variable name
      (`name/l1.weight`); a valid Python identifier. Defaults to the torch
      class name in snake case (`nn.BatchNorm1d` gives `batch_norm1d`).
    output_signature: optional `tf.TensorSpec`, or nest of them in the
      structure the forward returns (None for unknown dimensions), for
      code that neither meta tensors nor stand-in values can run: graph
      calls then take the shapes and dtypes declared instead of finding
      them while tracing, and write every buffer back after each call.
    torchscript: deprecated alias of `run="torch"`; True warns.
    run: the runner of graph calls: `"auto"` (the default), `"tf"` or
      `"torch"` (see **Runners** above). Eager calls always run torch.

  Raises:
    TypeError: `module` is not a `torch.nn.Module` (wrap a plain torch
      function with `tb.torch_function` instead), `output_signature` holds
      a leaf that is not a `tf.TensorSpec`, or `torchscript` is not a bool.
    ValueError: `run` is not `"auto"`, `"tf"` or `"torch"`;
      `torchscript=True` is given with `run="tf"`; `name` is not a valid
      Python identifier; a parameter or buffer of `module` is not
      initialized (lazy) or is on the meta device; or the module is created
      under a `tf.distribute` strategy the bridge does not support.

  Warns:
    DeprecationWarning: `torchscript=True` (pass `run="torch"` instead).

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> torch.manual_seed(0) and None
    >>> actor = tb.TorchModule(torch.nn.Linear(3, 2), name="actor")
    >>> [v.name for v in actor.trainable_variables]
    ['actor/bias:0', 'actor/weight:0']
    >>> opt = tf.keras.optimizers.SGD(0.1)
    >>> with tf.GradientTape() as tape:
    ...   loss = tf.reduce_sum(actor(tf.ones([4, 3])) ** 2)
    >>> _ = opt.apply_gradients(zip(tape.gradient(loss, actor.trainable_variables),
    ...                             actor.trainable_variables))
    >>> bool(torch.equal(actor.torch_module.weight,
    ...                  torch.from_numpy(actor.get_weights()["weight"])))
    True
  """

  def __init__(
    self,
    module: torch.nn.Module,
    name: str | None = None,
    output_signature: Any = None,
    torchscript: bool = False,
    run: str = "auto",
  ) -> None:
    _module_checks.check_is_module(module, "TorchModule(module)")
    _call.check_output_signature(output_signature, "TorchModule()")
    torchscript = _module_checks.check_torchscript(torchscript, "TorchModule")
    run = _runners.resolve_run(run, torchscript, "TorchModule")
    super().__init__(name=name or _snake_case(type(module).__name__))
    with self.name_scope:
      state = _torch_state.TorchState(module, f"TorchModule {self.name!r}", _make_variable)
    self._init_untracked(state, output_signature, run)
    # Tracked by name: the checkpoint keys are the torch paths.
    self._tf_variables = dict(state.variables)

  # Plain Python state, kept out of TF's checkpoint dependencies and out of
  # `tf.Module.variables`: only the variables are the module's TF state.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
    ("_state", "_runners", "_output_signature", "_run")
  ).union(tf.Module._TF_MODULE_IGNORED_PROPERTIES)

  @_compat.no_dependency_tracking
  def _init_untracked(
    self, state: _torch_state.TorchState, output_signature: Any, run: str
  ) -> None:
    state.name = self.name  # errors raised by calls name the module
    self._state = state
    self._runners = _runners.Runners(state, run)
    self._output_signature = output_signature
    self._run = run

  @property
  def run(self) -> str:
    """Which runner graph calls take: "auto", "tf" or "torch" (see the
    class docstring)."""
    return self._run

  @property
  def torch_module(self) -> torch.nn.Module:
    """The torch module, its parameters and buffers viewing the TF values.

    Its tensors are zero-copy views of the variables' current values, in
    place until the next bridged call (which puts placeholders back: the
    weights are held once, by the variables), so
    `torch.save(m.torch_module.state_dict(), path)` saves what TF trained.
    Calling the torch module, its `state_dict()`, `copy.deepcopy` and
    `torch.save` put the views in place too. Writing into them writes the
    variables; load values with `set_weights`.

    Examples:
      >>> import torch, torchbridge as tb
      >>> linear = torch.nn.Linear(3, 2)
      >>> net = tb.TorchModule(linear)
      >>> net.torch_module is linear
      True
    """
    return self._state.sync_torch()

  @tf.autograph.experimental.do_not_convert
  def __call__(self, *args: Any, training: bool | None = None, **kwargs: Any) -> Any:
    """Runs the torch module's forward on TF tensors.

    Eagerly the forward runs in torch; inside `tf.function` the call takes
    the runner `run=` chose (see the class docstring).

    Args:
      *args: positional inputs: TF tensors or nests of them, and static
        values passed to torch as they are.
      training: None, True or False: the torch mode for this call. With
        None, torch's own modes (inside `tf.function`: as traced, see above).
      **kwargs: keyword inputs, as `args`.

    Returns:
      The forward's result with TF tensors in place of torch tensors (the
        same nest: a tensor, a tuple, a dict, ...).

    Raises:
      TypeError: an input torch cannot take (a ragged, sparse or string
        tensor), or `training` is not None, True or False.
      Exception: what the torch forward raised: as it is eagerly; inside
        `tf.function`, an error holding its type, message and traceback.
        The module and its variables stay intact; the next call works.

    Examples:
      >>> import torch, tensorflow as tf, torchbridge as tb
      >>> net = tb.TorchModule(torch.nn.Sequential(
      ...     torch.nn.Linear(3, 4), torch.nn.Dropout(0.5)))
      >>> net(tf.ones([2, 3]), training=False).shape
      TensorShape([2, 4])
    """
    return self._runners.call(args, kwargs, training, self._output_signature)

  def __deepcopy__(self, memo: dict[int, Any]) -> TorchModule:
    """An independent TorchModule around a deep copy of the torch module,
    starting from this one's current values (as a tf.Module copies)."""
    import copy  # pylint: disable=import-outside-toplevel

    module_copy = copy.deepcopy(self.torch_module, memo)
    return _rebuild_torch_module(
      type(self), module_copy, self.name, self._output_signature, False, self._run
    )

  def __reduce__(self) -> tuple[Any, ...]:
    # Pickled as its torch module (holding the current values) and name.
    return (
      _rebuild_torch_module,
      (
        type(self),
        self.torch_module,
        self.name,
        self._output_signature,
        False,  # torchscript=, deprecated: `run` holds what it meant
        self._run,
      ),
    )

  def get_weights(self) -> dict[str, np.ndarray]:
    """The state as `{torch state_dict name: np.ndarray}`.

    The arrays are copies: later training does not change them. Tied
    parameters appear under each of their state_dict names.

    Examples:
      >>> import torch, torchbridge as tb
      >>> sorted(tb.TorchModule(torch.nn.Linear(3, 2)).get_weights())
      ['bias', 'weight']
    """
    return self._state.get_weights()

  def set_weights(self, weights: Mapping[str, Any]) -> None:
    """Sets the state from `{torch state_dict name: array}`.

    Accepts the form `get_weights()` returns, and also torch tensors or TF
    tensors as values, so a torch `state_dict` (or `torch.load` of one)
    loads directly. Strict: every state_dict name must be present, no other
    name may be, and each shape must match; nothing changes unless all
    entries are valid.

    Args:
      weights: a mapping from state_dict names to arrays or tensors.

    Raises:
      TypeError: `weights` is not a mapping, or a value is not numeric.
      ValueError: missing, unexpected or mis-shaped entries (all named).
    """
    self._state.set_weights(weights)


def _rebuild_torch_module(
  cls: type[TorchModule],
  module: torch.nn.Module,
  name: str,
  output_signature: Any = None,
  torchscript: bool = False,
  run: str = "auto",
) -> TorchModule:
  wrapper = cls.__new__(cls)
  TorchModule.__init__(
    wrapper,
    module,
    name=name,
    output_signature=output_signature,
    torchscript=torchscript,
    run=run,
  )
  return wrapper


def _make_variable(
  name: str, value_tf: tf.Tensor, trainable: bool, aggregation: tf.VariableAggregation
) -> tf.Variable:
  return tf.Variable(value_tf, name=name, trainable=trainable, aggregation=aggregation)


def _snake_case(class_name: str) -> str:
  name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)
  name = re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()
  return re.sub(r"\W", "_", name) or "torch_module"
