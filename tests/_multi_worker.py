"""One worker of the MultiWorkerMirroredStrategy test (test_multi_worker.py).

Run as `python tests/_multi_worker.py OUT.npz` with TF_CONFIG set: trains the
test's MLP on this worker's shard of the batch for a number of steps, once
eagerly and once in a tf.function, and saves the final weights of both.
Shared with the test: the model, the data and the training step.
"""

import sys

import numpy as np
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

import torchbridge as tb

GLOBAL_BATCH = 8
STEPS = 20


def mlp():
  torch.manual_seed(0)
  return torch.nn.Sequential(
    torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
  ).double()


def data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(GLOBAL_BATCH, 3)), rng.normal(size=(GLOBAL_BATCH, 2))


def make_step(module, optimizer):
  """One training step on a batch (a shard, under a strategy)."""

  def step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      # Scaled by the global batch, so the all-reduced (summed) gradients
      # are those of the mean loss over the whole batch.
      loss = tf.reduce_sum((module(x_tf) - y_tf) ** 2) / GLOBAL_BATCH
    grads = tape.gradient(loss, module.trainable_variables)
    optimizer.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  return step


def train(strategy, worker, num_workers, wrap):
  with strategy.scope():
    module = tb.TorchModule(mlp(), name="net")
    optimizer = tf.keras.optimizers.Adam(0.01)
    optimizer.build(module.trainable_variables)
  step = make_step(module, optimizer)
  x, y = data()
  rows = slice(worker * GLOBAL_BATCH // num_workers, (worker + 1) * GLOBAL_BATCH // num_workers)
  x_tf, y_tf = tf.constant(x[rows]), tf.constant(y[rows])
  run = wrap(lambda: strategy.run(step, (x_tf, y_tf)))
  for _ in range(STEPS):
    run()
  return module.get_weights()


def main(out_path):
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  resolver = strategy.cluster_resolver
  worker, num_workers = resolver.task_id, strategy.num_replicas_in_sync
  results = {}
  for mode, wrap in (("eager", lambda fn: fn), ("function", tf.function)):
    for name, value in train(strategy, worker, num_workers, wrap).items():
      results[f"{mode}/{name}"] = value
  np.savez(out_path, **results)


if __name__ == "__main__":
  main(sys.argv[1])
