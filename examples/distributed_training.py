"""A torch model trained by TF under tf.distribute.

    # Two replicas on this machine (GPUs if there are two, else two logical
    # CPU devices):
    python examples/distributed_training.py --replicas 2

    # One process per worker, on any machines: set TF_CONFIG in each, e.g.
    #   TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
    #               "task": {"type": "worker", "index": 0}}'
    python examples/distributed_training.py --multi-worker

Each replica runs the torch forward and backward on its shard of every
batch; TF all-reduces the gradients of the mirrored variables and the Keras
optimizer applies them, exactly as for a native Keras model.
"""

import argparse
import time

import numpy as np
import torch  # before tensorflow
import tensorflow as tf

import torchbridge as tb


def make_strategy(args):
  if args.multi_worker:
    return tf.distribute.MultiWorkerMirroredStrategy()
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= args.replicas:
    return tf.distribute.MirroredStrategy([f"/gpu:{k}" for k in range(args.replicas)])
  # No GPUs: split the CPU into logical devices (before TF starts running).
  tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * args.replicas,
  )
  return tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(args.replicas)])


def regression_data(n, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8)).astype(np.float32)
  y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
  return x, y


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--replicas", type=int, default=2)
  parser.add_argument("--multi-worker", action="store_true")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--global-batch", type=int, default=64)
  args = parser.parse_args()

  strategy = make_strategy(args)
  print(f"{type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas")
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
  with strategy.scope():
    model = tb.TorchModule(net, name="regressor")
    optimizer = tf.keras.optimizers.Adam(1e-2)
    # Keras optimizers create their slots before a tf.function runs them
    # under a strategy (for native variables too).
    optimizer.build(model.trainable_variables)

  x, y = regression_data(4096)
  dataset = (
    tf.data.Dataset.from_tensor_slices((x, y))
    .shuffle(4096, seed=0)
    .repeat()
    .batch(args.global_batch)
  )
  batches = iter(strategy.experimental_distribute_dataset(dataset))

  def replica_step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      per_example = tf.reduce_mean((model(x_tf) - y_tf) ** 2, axis=1)
      loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function
  def train_step(batch):
    losses = strategy.run(replica_step, batch)
    return strategy.reduce("SUM", losses, axis=None)

  start = time.perf_counter()
  for step in range(1, args.steps + 1):
    loss = train_step(next(batches))
    if step % 100 == 0 or step == args.steps:
      print(
        f"step {step:5d}  loss {float(loss):.4f}  "
        f"{(time.perf_counter() - start) / step * 1e3:.1f} ms/step"
      )
  # The trained torch module, e.g. for torch.save:
  trained = model.torch_module
  print("first weight row:", trained[0].weight[0, :4].tolist())


if __name__ == "__main__":
  main()
