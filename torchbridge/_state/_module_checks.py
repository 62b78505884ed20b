"""What a wrapper checks about the torch module and the values it is handed,
and the errors that teach the fix; and the train/eval mode of one call."""

from __future__ import annotations

import warnings

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._crossing import _exchange

_TRAINING_NOT_BOOL = """\
{name}(training=...) must be None, True or False, got {received!r}. Inside
tf.function the torch mode is fixed when tracing: pass a Python bool (Keras
does), or call the module in two tf.functions, one per mode."""


def check_is_module(module: object, owner_name: str) -> None:
  """Raises a TypeError, with the fix, for anything but a torch module."""
  if not isinstance(module, torch.nn.Module):
    raise TypeError(
      f"{owner_name} expects a torch.nn.Module, got {module!r} of type "
      f"{type(module).__name__}. Wrap a plain torch function with "
      "tb.torch_function instead: `f = tb.torch_function(fn)`."
    )


def check_module(module: torch.nn.Module, owner_name: str) -> None:
  """Raises for modules that cannot be wrapped (not a module, lazy, meta)."""
  check_is_module(module, owner_name)
  for n, t in list(module.named_parameters()) + list(module.named_buffers()):
    if torch.nn.parameter.is_lazy(t):
      raise ValueError(
        f"{owner_name}: torch parameter or buffer {n!r} is not initialized "
        "yet (a lazy module such as nn.LazyLinear). Run the torch module "
        "once on an example input before wrapping it, e.g. "
        "`module(torch.zeros(1, in_features))`."
      )
    if t.is_meta:
      raise ValueError(
        f"{owner_name}: torch parameter or buffer {n!r} is on the meta "
        "device and holds no values. Materialize it first, e.g. "
        "`module.to_empty(device='cpu')`, then initialize or load weights."
      )


_DTYPE_MISMATCH = """\
{name}: the torch module failed on {inputs}.
Its floating parameters are {param}, and torch does not convert dtypes:
  {error_type}: {error}
Cast the inputs to {param} before the call, e.g. `tf.cast(x, tf.{param})` (in
a Keras model: `keras.Input(shape, dtype="{param}")`){module_fix}."""


def floating_dtype(module: torch.nn.Module) -> str | None:
  """The TF name of the module's floating dtype, or None when it has several
  (or none)."""
  dtypes = {
    t.dtype for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()
  }
  if len(dtypes) == 1:
    return tf.as_dtype(str(dtypes.pop()).replace("torch.", "")).name
  return None


def explain_dtype_error(
  err: BaseException, name: str, module: torch.nn.Module, inputs_torch: Sequence[torch.Tensor]
) -> None:
  """Raises, from `err`, an error naming the input and parameter dtypes and
  the fix, when inputs of the wrong dtype likely caused `err` (a torch
  error from the module's forward); returns otherwise."""
  if not isinstance(err, (RuntimeError, TypeError)) or "type" not in str(err).lower():
    return
  params = sorted(
    {str(p.dtype).replace("torch.", "") for p in module.parameters() if p.is_floating_point()}
  )
  odd = [
    (k, t) for k, t in enumerate(inputs_torch) if str(t.dtype).replace("torch.", "") not in params
  ]
  if len(params) != 1 or not odd:
    return
  inputs = ", ".join(
    f"input {k} of dtype {str(t.dtype).replace('torch.', '')} (shape {tuple(t.shape)})"
    for k, t in odd
  )
  module_fix = ""
  if all(t.is_floating_point() for _, t in odd):
    module_fix = (
      ", or convert the torch module to the inputs' dtype "
      "before wrapping it (e.g. `module.double()`)"
    )
  message = _DTYPE_MISMATCH.format(
    name=name,
    inputs=inputs,
    param=params[0],
    error_type=type(err).__name__,
    error=err,
    module_fix=module_fix,
  )
  try:
    explained = type(err)(message)
  except Exception:  # an exception type whose constructor wants more
    explained = RuntimeError(message)
  raise explained from err


def set_modes(
  module: torch.nn.Module,
  modules: Sequence[torch.nn.Module],
  training: bool | Sequence[bool] | None,
) -> list[tuple[torch.nn.Module, bool]] | None:
  """Sets train/eval mode on a torch module for one call: the modes to put
  back with `restore_modes` afterwards, or None where nothing changed.

  `training` is None (leave the modes), a bool (for every submodule), or a
  list of bools, one per module of `modules` (`list(module.modules())`).
  Modules already in the wanted mode are left alone, so the usual call (the
  modes as they are) costs a comparison per submodule.
  """
  if training is None:
    return None
  saved = None
  if isinstance(training, bool):
    if any(m.training != training for m in modules):
      saved = [(m, m.training) for m in modules]
      module.train(training)
    return saved
  for m, mode in zip(modules, training):
    if m.training != mode:
      if saved is None:
        saved = [(m, m.training) for m in modules]
      m.training = mode
  return saved


def restore_modes(saved: list[tuple[torch.nn.Module, bool]]) -> None:
  for m, mode in saved:
    m.training = mode


def check_torchscript(torchscript: Any, owner: str) -> bool:
  """`torchscript=`, deprecated: a Python bool (True warns, and means
  run="torch"); a TypeError naming the fix otherwise."""
  if not isinstance(torchscript, (bool, np.bool_)):
    raise TypeError(
      f"{owner}(torchscript=...) is deprecated and takes True or False, got "
      f"{torchscript!r} ({type(torchscript).__name__}); leave it out: graph "
      'calls that run torch run from C++ already (run="torch").'
    )
  if torchscript:
    warnings.warn(
      f'{owner}(torchscript=True) is deprecated and means run="torch": graph '
      "calls that run torch run from C++ (a torch.export capture, no TorchScript) "
      'whenever they can. Pass run="torch" instead (or nothing: run="auto" runs '
      "the exact TF translation where it holds).",
      DeprecationWarning,
      stacklevel=3,
    )
  return bool(torchscript)


def as_python_bool(training: Any, name: str) -> bool:
  if isinstance(training, (bool, np.bool_)):
    return bool(training)
  if (
    isinstance(training, (tf.Tensor, tf.Variable))
    and tf.executing_eagerly()
    and training.dtype == tf.bool
    and training.shape.rank == 0
  ):
    return bool(training.numpy())
  raise TypeError(_TRAINING_NOT_BOOL.format(name=name, received=training))


def as_numpy(value: Any, key: str, name: str) -> np.ndarray:
  if isinstance(value, torch.Tensor):
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
      return _exchange.tensor_to_tf(value).numpy()
    return value.numpy()
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return value.numpy()
  try:
    array = np.asarray(value)
  except Exception as err:
    raise TypeError(
      f"{name}.set_weights(): entry {key!r} is a {type(value).__name__}, "
      "expected a numpy array or a tensor."
    ) from err
  if array.dtype == object or array.dtype.kind in "USV":
    raise TypeError(
      f"{name}.set_weights(): entry {key!r} has dtype {array.dtype}, "
      "expected numeric values (a numpy array or a tensor)."
    )
  return array
