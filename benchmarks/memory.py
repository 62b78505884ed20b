"""Peak memory of a few training steps, run in a process of its own.

Usage: python -m benchmarks.memory {torchbridge,keras} MODEL DEVICE
Prints one JSON line: resident memory before the steps, its peak during
them, and the difference (what the training steps needed on top).
"""

import json
import sys

import torch  # before TensorFlow
import numpy as np
import tensorflow as tf

import torchbridge as tb
from benchmarks import models


def _rss_mb(field):
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"{field} not in /proc/self/status")


def main(contender, model_name, device):
  torch.manual_seed(0)
  shape_torch, shape_keras, shape_target = models.batch_shapes(model_name)
  rng = np.random.default_rng(0)
  if contender == "torchbridge":
    model = tb.TorchModule(models.torch_model(model_name).to(device), name="m")
    x = tf.constant(rng.standard_normal(shape_torch, dtype=np.float32))
  else:
    model = models.keras_model(model_name)
    x = tf.constant(rng.standard_normal(shape_keras, dtype=np.float32))
  y = tf.constant(rng.standard_normal(shape_target, dtype=np.float32))
  optimizer = tf.keras.optimizers.Adam(1e-4)
  optimizer.build(model.trainable_variables)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  step.get_concrete_function()  # trace outside the measured window
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the current resident size
  before = _rss_mb("VmRSS")
  for _ in range(3):
    step().numpy()
  peak = _rss_mb("VmHWM")
  print(json.dumps({"rss_before_mb": before, "peak_rss_mb": peak, "step_peak_mb": peak - before}))


if __name__ == "__main__":
  main(*sys.argv[1:4])
