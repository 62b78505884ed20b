"""`TorchLayer`: a torch module as a Keras 3 layer under the TF backend."""

from __future__ import annotations

import base64
import inspect
import io
from collections.abc import Mapping
from typing import Any

import numpy as np

import torch  # before TensorFlow (and Keras, which imports it)
import keras
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._native import _xla
from torchbridge import _call
from torchbridge import _runners
from torchbridge._state import _module_checks
from torchbridge._state import _torch_state

_UNSAFE_LOAD = """\
Refusing to load the torch module stored in the config of TorchLayer {name!r}:
it is a pickle, and unpickling it with `torch.load` carries a risk of
arbitrary code execution. If you trust the file, load it with
`keras.models.load_model(path, safe_mode=False)` (or pass `safe_mode=False`
to `TorchLayer.from_config` / `keras.saving.deserialize_keras_object`, or
call `keras.config.enable_unsafe_deserialization()` first). To load in safe
mode instead, build the torch module in code: a subclass of TorchLayer whose
`__init__` creates its torch module (and takes no `module` argument), or a
subclassed keras.Model that creates the TorchLayer in its `__init__`."""

_NO_STATE = """\
TorchLayer {name!r}: the torch module {module_type} has no parameters and no
buffers, so there is nothing for Keras to train or save. If the module keeps
submodules or tensors in plain Python lists or dicts, torch does not see
them: use nn.ModuleList / nn.ModuleDict / nn.Parameter / register_buffer. If
the module is stateless on purpose, wrap its function instead:
  keras.layers.Lambda(tb.torch_function(module))"""


@keras.saving.register_keras_serializable(package="torchbridge")
class TorchLayer(keras.layers.Layer):
  """A torch `nn.Module` as a Keras 3 layer (TensorFlow backend).

  Its weights are `keras.Variable`s, one per torch parameter and buffer,
  named after the torch path (`l1.weight`); parameters with
  `requires_grad=True` are trainable, frozen parameters and buffers are not.
  The forward runs in torch on zero-copy views of the weights, as in
  `tb.TorchModule`; it works in `Sequential`, functional and subclassed
  models, with `fit` / `evaluate` / `predict` (compiled or `run_eagerly`).

  `training` follows Keras: `True` in `fit`, `False` in `evaluate` and
  `predict`; a direct call without `training` leaves torch's own mode
  (inside a `tf.function`, the mode it had when traced: a graph whose
  module was switched since raises `tb.StaleCaptureError`).

  Graph calls (`fit`, `predict`, a `tf.function`) take the runner `run=`
  chooses, as in `tb.TorchModule`: by default the module's exact TF
  translation where it holds (checked against torch when captured), so
  the layer keeps `supports_jit = True` and Keras may compile it with XLA
  (`jit_compile=True`; Keras' `"auto"` picks XLA on GPU machines). With
  `run="torch"` torch runs as an XLA custom call on the CPU, and
  `supports_jit` says whether that can be had here; where it cannot,
  Keras' `"auto"` compiles without XLA, `compile(jit_compile=True)` warns
  and falls back, and a forced XLA call raises an error that says so.

  Saving: `save_weights` / `load_weights` store the weights as any layer's.
  `model.save("m.keras")` also stores the torch module itself (pickled with
  `torch.save`, as Keras' own `TorchModuleWrapper` does), and
  `keras.models.load_model` unpickles it only with `safe_mode=False`, since
  unpickling can run arbitrary code. Models that build their torch modules in
  code load in safe mode: subclass `TorchLayer` with an `__init__` that
  creates the torch module and takes no `module` argument (the config then
  holds no pickle), or build the `TorchLayer` in a subclassed `keras.Model`.

  Args:
    module: the torch module, with all parameters initialized.
    output_signature: optional `tf.TensorSpec` or nest of them, the
      forward's result (None for unknown dimensions): declared, nothing is
      inferred while tracing (see `tb.TorchModule`); every buffer is then
      written back after each call. Not part of the layer's config.
    torchscript: deprecated alias of `run="torch"` (True warns).
    run: "auto" (default), "tf" or "torch": the runner of graph calls
      (see `tb.TorchModule`). Part of the layer's config.
    **kwargs: Keras layer arguments (`name`, `dtype`, `trainable`). `dtype`
      defaults to the dtype of the module's floating parameters, and must
      match it when given (Keras casts floating inputs to it).

  Raises:
    TypeError: `module` is not a `torch.nn.Module`, `output_signature`
      holds a leaf that is not a `tf.TensorSpec`, or `torchscript` is not
      a bool.
    ValueError: `run` is not `"auto"`, `"tf"` or `"torch"`;
      `torchscript=True` is given with `run="tf"`; the module has no
      parameters and no buffers; a parameter or buffer is not initialized
      (lazy) or is on the meta device; `dtype` differs from the module's
      floating dtype; or the layer is created under a `tf.distribute`
      strategy the bridge does not support.

  Warns:
    DeprecationWarning: `torchscript=True` (pass `run="torch"` instead).

  Examples:
    >>> import torch, keras, torchbridge as tb
    >>> model = keras.Sequential([
    ...     keras.Input((4,)),
    ...     tb.keras.TorchLayer(torch.nn.Linear(4, 1), name="linear")])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> [w.path for w in model.trainable_weights]
    ['linear/weight', 'linear/bias']
  """

  def __init__(
    self,
    module: torch.nn.Module,
    output_signature: Any = None,
    torchscript: bool = False,
    run: str = "auto",
    **kwargs: Any,
  ) -> None:
    name = kwargs.get("name") or "torch_layer"
    _module_checks.check_module(module, f"TorchLayer {name!r}")
    torchscript = _module_checks.check_torchscript(torchscript, "TorchLayer")
    run = _runners.resolve_run(run, torchscript, "TorchLayer")
    if not any(True for _ in module.parameters()) and not any(True for _ in module.buffers()):
      raise ValueError(_NO_STATE.format(name=name, module_type=type(module).__name__))
    module_dtype = _module_checks.floating_dtype(module)
    kwargs.setdefault("dtype", module_dtype)
    super().__init__(**kwargs)
    _check_dtype(self, module_dtype)
    self._run = run  # "torch": XLA only where its custom call can be had
    self._output_signature = _call.check_output_signature(output_signature, f"TorchLayer {name!r}")
    self._torch_state = _torch_state.TorchState(module, self.name, self._make_weight)
    self._runners = _runners.Runners(self._torch_state, run)
    # By torch name in a trackable holder, for tf.train.Checkpoint and SavedModel
    # (Keras' `weights` keep them once, through add_weight, and ignore it).
    holder = tf.Module()
    for name, variable in self._torch_state.variables.items():
      setattr(holder, name, variable)
    self._torch_variables = holder
    self.built = True

  @property
  def supports_jit(self) -> bool:
    """Whether Keras may compile this layer with XLA (see `_xla.jit_usable`)."""
    if self.__dict__.get("_run") != "torch":
      return self.__dict__.get("_supports_jit", True)
    return _xla.jit_usable()

  @supports_jit.setter
  def supports_jit(self, value: bool) -> None:
    self.__dict__["_supports_jit"] = value

  def _make_weight(
    self, name: str, value_tf: tf.Tensor, trainable: bool, aggregation: tf.VariableAggregation
  ) -> keras.Variable:
    return self.add_weight(
      shape=tuple(value_tf.shape),
      dtype=value_tf.dtype.name,
      initializer=lambda shape, dtype: value_tf,
      trainable=trainable,
      autocast=False,
      name=name,
      aggregation=_KERAS_AGGREGATION[aggregation],
    )

  @property
  def torch_module(self) -> torch.nn.Module:
    """The torch module, its tensors viewing the layer's current weights.

    As `TorchModule.torch_module`: zero-copy views, in place until the
    next bridged call.
    """
    return self._torch_state.sync_torch()

  def call(self, *args: Any, training: bool | None = None, **kwargs: Any) -> Any:
    """Runs the torch module's forward (Keras calls it: `layer(x)`).

    Args:
      *args: positional inputs: tensors or nests of them, and static
        values passed to torch as they are.
      training: None, True or False: the torch mode for this call (Keras
        passes True in `fit`, False in `evaluate` and `predict`). With
        None, torch's own modes.
      **kwargs: keyword inputs, as `args`.

    Returns:
      The forward's result with TF tensors in place of torch tensors.
    """
    return self._runners.call(args, kwargs, training, self._output_signature)

  def compute_output_spec(self, *args: Any, **kwargs: Any) -> Any:
    # A functional model's build reads specs from a graph never run: no capture.
    with self._runners.specs_only():
      return super().compute_output_spec(*args, **kwargs)

  def get_weights_by_name(self) -> dict[str, np.ndarray]:
    """The weights as `{torch state_dict name: np.ndarray}`.

    Returns:
      A new dict of copies: later training does not change them.

    Examples:
      >>> import torch, torchbridge as tb
      >>> sorted(tb.keras.TorchLayer(torch.nn.Linear(3, 2)).get_weights_by_name())
      ['bias', 'weight']
    """
    return self._torch_state.get_weights()

  def set_weights_by_name(self, weights: Mapping[str, Any]) -> None:
    """Sets the weights from `{torch state_dict name: array}` (strict).

    As `TorchModule.set_weights`: a torch `state_dict` loads directly;
    every name must be present, no other name may be, each shape must
    match, and nothing changes unless all entries are valid.

    Args:
      weights: a mapping from state_dict names to arrays or tensors.

    Raises:
      TypeError: `weights` is not a mapping, or a value is not numeric.
      ValueError: missing, unexpected or mis-shaped entries (all named).
    """
    self._torch_state.set_weights(weights)

  def get_config(self) -> dict[str, Any]:
    config = super().get_config()
    # Subclasses whose __init__ builds the module (and so takes no `module`
    # argument) are rebuilt by their code: no pickle in their config.
    # (`torchscript=True`, deprecated, is saved as the run="torch" it means.)
    parameters = inspect.signature(type(self).__init__).parameters
    if self._run != "auto" and "run" in parameters:
      config["run"] = self._run
    if "module" in parameters:
      buffer = io.BytesIO()
      torch.save(self.torch_module, buffer)
      config["module"] = base64.b64encode(buffer.getvalue()).decode("ascii")
    return config

  @classmethod
  def from_config(
    cls,
    config: Mapping[str, Any],
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool | None = None,
  ) -> TorchLayer:
    """Rebuilds the layer; unpickles a stored torch module only when unsafe.

    As Keras' own `TorchModuleWrapper.from_config`; `load_model` calls it.

    Args:
      config: what `get_config()` returned.
      custom_objects: accepted for Keras' signature, unused.
      safe_mode: False allows `torch.load` of the pickled module; None
        follows the enclosing deserialization scope
        (`load_model(..., safe_mode=...)`), and a call outside any scope
        counts as safe (fails closed).

    Returns:
      The rebuilt layer.

    Raises:
      ValueError: the config holds a pickled torch module and the load is
        in safe mode (the message says how to load it).
    """
    del custom_objects  # nothing in the config refers to custom objects
    config = dict(config)
    if "module" in config:
      if safe_mode is None:
        safe_mode = _compat.keras_in_safe_mode()
      # Unset (a direct from_config call) counts as safe: fail closed.
      if safe_mode is not False:
        raise ValueError(_UNSAFE_LOAD.format(name=config.get("name")))
      config["module"] = torch.load(
        io.BytesIO(base64.b64decode(config["module"])), weights_only=False
      )
    return cls(**config)


_KERAS_AGGREGATION = {
  tf.VariableAggregation.NONE: "none",
  tf.VariableAggregation.MEAN: "mean",
  tf.VariableAggregation.ONLY_FIRST_REPLICA: "only_first_replica",
}


def _check_dtype(layer: TorchLayer, module_dtype: str | None) -> None:
  if module_dtype is None or layer.compute_dtype == module_dtype:
    return
  raise ValueError(
    f"TorchLayer {layer.name!r} got dtype={layer.dtype_policy.name!r}, but "
    f"the torch module's floating parameters and buffers are "
    f"{module_dtype}. Keras casts floating inputs to the layer's compute "
    f"dtype ({layer.compute_dtype}), and torch does not convert them "
    f"again. Leave dtype out (it defaults to {module_dtype}), or convert "
    "the torch module first, e.g. `module.float()` / `module.double()`."
  )
