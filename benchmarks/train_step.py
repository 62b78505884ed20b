"""One training step (forward, MSE loss, backward, Adam) of each contender.

Each contender's step is built in the process that times it
(`benchmarks/step_process.py`), so no contender runs beside another.
"""

import numpy as np
import tensorflow as tf
import torch

import torchbridge as tb
from torchbridge._native import _loader
from benchmarks import bare_native
from benchmarks import models
from benchmarks import numpy_bridge

BRIDGED = "torchbridge tf.function"
PY_PATH = "torchbridge tf.function (tf.py_function path)"
PURE_TORCH = "pure torch"
TORCH_FORWARD_BACKWARD = "pure torch, forward and backward only"
KERAS = "keras tf.function"
BRIDGED_EAGER = "torchbridge eager"
KERAS_EAGER = "keras eager"
NUMPY_COPY = "numpy-copy bridge tf.function"
# An MLP step makes two bridged calls: the forward and the backward.
FLOOR = "floor: TF function + Keras Adam + 2 bare native ops"
# The same, its ops handing back fresh torch tensors (step_breakdown's).
FLOOR_TORCH_OUTPUTS = "floor, torch tensors in and out of the bare ops"
# The same ops running the torch module with the least Python a bridge can
# (bare_native.LeanTorchModule; step_breakdown's).
LEAN_BRIDGE = "leanest Python bridge on the same ops"

CONTENDERS = (
  BRIDGED,
  PY_PATH,
  PURE_TORCH,
  TORCH_FORWARD_BACKWARD,
  KERAS,
  BRIDGED_EAGER,
  KERAS_EAGER,
  NUMPY_COPY,
  FLOOR,
  FLOOR_TORCH_OUTPUTS,
  LEAN_BRIDGE,
)


def contenders(model_name, quick, device):
  """The contenders measured for a model, in the order they are reported."""
  names = [BRIDGED, PURE_TORCH, KERAS]
  small = model_name == "small_mlp"
  if small and _loader.available():
    names.append(PY_PATH)
  if device == "cpu":  # the numpy bridge moves everything through host memory
    names.append(NUMPY_COPY)
  if small and _loader.available():
    names.append(FLOOR)
  if not quick and small:
    names.append(TORCH_FORWARD_BACKWARD)
  if not quick and model_name != "large_mlp":  # eager large MLP: ~0.5-1 s a step
    names += [BRIDGED_EAGER, KERAS_EAGER]
  return names


def _tf_device(device):
  return "/GPU:0" if device == "cuda" else "/CPU:0"


def build(model_name, contender, device):
  """The zero-argument step function of `contender` for `model_name`."""
  if contender not in CONTENDERS:
    raise ValueError(f"unknown contender {contender!r}; expected one of {CONTENDERS}")
  torch.manual_seed(0)
  shape_torch, shape_keras, shape_target = models.batch_shapes(model_name)
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal(shape_torch, dtype=np.float32)
  y_np = rng.standard_normal(shape_target, dtype=np.float32)
  if contender in (PURE_TORCH, TORCH_FORWARD_BACKWARD):
    return _torch_step(model_name, x_np, y_np, device, optimizer=contender == PURE_TORCH)
  if contender in (KERAS, KERAS_EAGER):
    if len(shape_torch) == 4:  # TF's CPU convolutions take NHWC only
      x_np = np.ascontiguousarray(x_np.transpose(0, 2, 3, 1))
    model = models.keras_model(model_name)
  elif contender == NUMPY_COPY:
    model = numpy_bridge.NumpyBridgeModule(models.torch_model(model_name))
  elif contender == FLOOR:
    model = bare_native.BareNativeModule(models.torch_model(model_name))
  elif contender == FLOOR_TORCH_OUTPUTS:
    model = bare_native.BareNativeModule(models.torch_model(model_name), torch_outputs=True)
  elif contender == LEAN_BRIDGE:
    model = bare_native.LeanTorchModule(models.torch_model(model_name))
  else:
    # The bridge (torch through the native op or tf.py_function) on its
    # Python path: this suite measures what the bridge costs;
    # benchmarks/runners.py compares the default runner (the module's TF
    # translation) and the C++ torch runner.
    model = tb.TorchModule(models.torch_model(model_name).to(device), name="bridged", run="torch")
    model._runners.torch_runner.enabled = False  # pylint: disable=protected-access
  with tf.device(_tf_device(device)):
    x_tf, y_tf = tf.constant(x_np), tf.constant(y_np)
  step = _tf_step(model, x_tf, y_tf)
  if contender in (BRIDGED_EAGER, KERAS_EAGER):
    return step
  step = tf.function(step)
  if contender == PY_PATH:
    with _loader.python_path():  # traced now, on the tf.py_function path
      step.get_concrete_function()
  return step


def _tf_step(model, x_tf, y_tf):
  optimizer = tf.keras.optimizers.Adam(1e-4)

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(x_tf) - y_tf) ** 2)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return step


def _torch_step(model_name, x_np, y_np, device, optimizer):
  model = models.torch_model(model_name).to(device)
  x_torch = torch.from_numpy(x_np).to(device)
  y_torch = torch.from_numpy(y_np).to(device)
  adam = torch.optim.Adam(model.parameters(), 1e-4)

  def step():
    adam.zero_grad(set_to_none=True)
    loss = torch.mean((model(x_torch) - y_torch) ** 2)
    loss.backward()
    if optimizer:
      adam.step()
    return loss

  return step
