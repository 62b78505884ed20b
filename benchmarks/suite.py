"""The measurements: exchange, per-call overhead, training steps, memory."""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
import torch
import torch.utils.dlpack as torch_dlpack

import torchbridge as tb
from torchbridge import _native
from benchmarks import harness
from benchmarks import models
from benchmarks import numpy_bridge

EXCHANGE_SIZES = {"4KB": 4 << 10, "256KB": 256 << 10, "16MB": 16 << 20,
                  "64MB": 64 << 20}


def exchange(quick, device):
  """Round trip TF -> torch -> TF: torchbridge against numpy copies."""
  sizes = ["4KB", "256KB", "16MB"] if quick else list(EXCHANGE_SIZES)
  results = {}
  for label in sizes:
    n_bytes = EXCHANGE_SIZES[label]
    with tf.device(_tf_device(device)):
      x_tf = tf.random.uniform([n_bytes // 4])
    tb.reset_exchange_stats()
    tb.to_tf(tb.to_torch(x_tf))
    tb_bytes = tb.exchange_stats()["bytes_copied"]
    numpy_calls = max(1, min(50, (32 << 20) // n_bytes))
    timings = harness.interleaved(
        {"torchbridge": lambda: tb.to_tf(tb.to_torch(x_tf)),
         "numpy_copy": lambda: numpy_bridge.exchange_round_trip(x_tf)},
        repeats=5 if quick else 9,
        calls={"torchbridge": 200, "numpy_copy": numpy_calls}, warmup=3)
    results[label] = {
        "bytes": n_bytes, "timings": timings,
        "bytes_copied": {
            "torchbridge": tb_bytes,
            "numpy_copy": numpy_bridge.bytes_copied_by_round_trip(x_tf)}}
  return results


def overhead(quick, device):
  """Per-call cost of an identity: bridged, bare py_function, bare function."""
  with tf.device(_tf_device(device)):
    x_tf = tf.random.normal([64, 32])
  identity_tb = tb.torch_function(lambda x: x, name="identity")

  @tf.function
  def bare_function(x):
    return tf.identity(x)

  @tf.function
  def bare_py_function(x):
    return tf.py_function(lambda v: v, [x], Tout=tf.float32)

  @tf.function
  def bridged_function(x):
    return identity_tb(x)

  @tf.function
  def bridged_py_function(x):
    return identity_tb(x)

  with _native.python_path():  # traced now, on the tf.py_function path
    bridged_py_function.get_concrete_function(x_tf)
  contenders = {
      "tf.function identity": lambda: bare_function(x_tf),
      "tf.py_function identity (in tf.function)": lambda: bare_py_function(x_tf),
      "torchbridge identity, tf.py_function path (in tf.function)":
          lambda: bridged_py_function(x_tf),
  }
  if _native.available():
    @tf.function
    def bare_native_op(x):  # hands its input capsule straight back
      return _native.call(list, [x], [tf.float32], [x.shape])[0]

    def dlpack_round_trip(capsules):  # the least any Python-side bridge does
      return [torch_dlpack.to_dlpack(torch_dlpack.from_dlpack(c))
              for c in capsules]

    @tf.function
    def round_trip_native_op(x):
      return _native.call(dlpack_round_trip, [x], [tf.float32], [x.shape])[0]

    @tf.function
    def torch_tensors_native_op(x):  # the op's C++ conversions only
      return _native.call(lambda args_torch, unused: args_torch, [x],
                          [tf.float32], [x.shape], torch_tensors=True)[0]

    contenders.update({
        "native op doing nothing (in tf.function)": lambda: bare_native_op(x_tf),
        "native op, torch DLPack round trip only (in tf.function)":
            lambda: round_trip_native_op(x_tf),
        "native op, torch tensors handed back (in tf.function)":
            lambda: torch_tensors_native_op(x_tf),
        "torchbridge identity, native op (in tf.function)":
            lambda: bridged_function(x_tf)})
  contenders.update({
      "eager tf.py_function identity": lambda: tf.py_function(
          lambda v: v, [x_tf], Tout=tf.float32),
      "eager torchbridge identity": lambda: identity_tb(x_tf),
  })
  return harness.interleaved(contenders, repeats=7 if quick else 15,
                             calls=100 if quick else 300, warmup=50)


def train_steps(model_name, quick, device):
  """One training step (forward, MSE loss, backward, Adam) per contender."""
  torch.manual_seed(0)
  shape_torch, shape_keras, shape_target = models.batch_shapes(model_name)
  rng = np.random.default_rng(0)
  x_torch_np = rng.standard_normal(shape_torch, dtype=np.float32)
  x_keras_np = (np.ascontiguousarray(x_torch_np.transpose(0, 2, 3, 1))
                if len(shape_torch) == 4 else x_torch_np)
  y_np = rng.standard_normal(shape_target, dtype=np.float32)
  with tf.device(_tf_device(device)):
    x_tf, x_keras_tf, y_tf = (tf.constant(x_torch_np), tf.constant(x_keras_np),
                              tf.constant(y_np))
  x_torch = torch.from_numpy(x_torch_np).to(device)
  y_torch = torch.from_numpy(y_np).to(device)

  def tf_step(model, variables_fn, x):
    optimizer = tf.keras.optimizers.Adam(1e-4)

    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y_tf) ** 2)
      variables = variables_fn()
      optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
      return loss
    return step

  bridged = tb.TorchModule(models.torch_model(model_name).to(device),
                           name="bridged")
  copied = numpy_bridge.NumpyBridgeModule(models.torch_model(model_name))
  keras_model = models.keras_model(model_name)
  pure_torch = models.torch_model(model_name).to(device)
  torch_optimizer = torch.optim.Adam(pure_torch.parameters(), 1e-4)

  def torch_step():
    torch_optimizer.zero_grad(set_to_none=True)
    loss = torch.mean((pure_torch(x_torch) - y_torch) ** 2)
    loss.backward()
    torch_optimizer.step()
    return loss

  steps = {
      "torchbridge tf.function": tf.function(tf_step(
          bridged, lambda: bridged.trainable_variables, x_tf)),
      "torchbridge eager": tf_step(
          bridged, lambda: bridged.trainable_variables, x_tf),
      "keras tf.function": tf.function(tf_step(
          keras_model, lambda: keras_model.trainable_variables, x_keras_tf)),
      "keras eager": tf_step(
          keras_model, lambda: keras_model.trainable_variables, x_keras_tf),
      "pure torch": torch_step,
  }
  if _native.available() and model_name == "small_mlp":
    # The same step on the tf.py_function path, traced side by side.
    py_path_step = tf.function(tf_step(
        bridged, lambda: bridged.trainable_variables, x_tf))
    with _native.python_path():
      py_path_step.get_concrete_function()
    steps["torchbridge tf.function (tf.py_function path)"] = py_path_step
  if device == "cpu":  # the numpy bridges move everything through host memory
    steps["numpy-copy bridge tf.function"] = tf.function(tf_step(
        copied, lambda: copied.trainable_variables, x_tf))
    steps["numpy-copy bridge eager"] = tf_step(
        copied, lambda: copied.trainable_variables, x_tf)
  sizes = {"small_mlp": (20, 15), "large_mlp": (1, 5), "cnn": (3, 7)}
  calls, repeats = sizes[model_name]
  if quick:
    repeats = 3
  sync = torch.cuda.synchronize if device == "cuda" else None
  return harness.interleaved(steps, repeats=repeats, calls=calls,
                             warmup=3, sync=sync)


def peak_memory(model_name, device):
  """Peak resident memory of training steps, each contender in its own process."""
  results = {}
  for contender in ("torchbridge", "keras"):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", contender, model_name, device],
        capture_output=True, text=True, check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    results[contender] = json.loads(out.stdout.strip().splitlines()[-1])
  return results


def _tf_device(device):
  return "/GPU:0" if device == "cuda" else "/CPU:0"
