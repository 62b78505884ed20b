"""Data-parallel training on Ray: actors compute a torch model's gradients, TF applies them.

Each Ray actor builds the torch MLP as a `tb.TorchModule`, holds one shard
of the training set and computes the gradients of the mean squared error on
it; the driver averages them (weighted by shard sizes), applies Keras Adam
to its own `TorchModule`, and sends the new weights to every actor with one
`ray.put`. The driver's module and optimizer are ordinary TF objects: the
run ends with a `tf.train.Checkpoint` of them.

  python examples/ray_data_parallel.py                     # local Ray
  python examples/ray_data_parallel.py --address auto      # a running cluster
  python examples/ray_data_parallel.py --steps 20 --workers 2   # quick

On a cluster every node needs torchbridge, torch and TensorFlow installed;
the model and loss below travel with the job (Ray pickles functions of the
driver script by value).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ logs

import torch  # noqa: E402  (first, the recommended order: docs/troubleshooting.md, "Does the import order matter?")
import numpy as np  # noqa: E402
import ray  # noqa: E402
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402


def make_model():
  """The torch model; called once on the driver and once in each actor."""
  return torch.nn.Sequential(
    torch.nn.Linear(8, 64),
    torch.nn.Tanh(),
    torch.nn.Linear(64, 64),
    torch.nn.Tanh(),
    torch.nn.Linear(64, 1),
  )


def mse(module, x, y):
  """The loss each actor differentiates: a mean over its shard's samples."""
  return tf.reduce_mean((module(x, training=True) - y) ** 2)


def make_data(n, seed):
  """A smooth nonlinear regression problem: y = sin(x @ w) + x0 * x1 + noise."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8)).astype(np.float32)
  w = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
  y = np.sin(x @ w)[:, None] + x[:, :1] * x[:, 1:2]
  y += 0.05 * rng.normal(size=y.shape).astype(np.float32)
  return x, y.astype(np.float32)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
    "--address",
    default=None,
    help="Ray cluster address ('auto', 'ray://host:10001'); default: start Ray on this machine",
  )
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--steps", type=int, default=300, help="training steps")
  p.add_argument(
    "--samples", type=int, default=4096, help="training samples, split evenly over the workers"
  )
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="directory for results.json and the TF checkpoint")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if not ray.is_initialized():
    # Locally, no dashboard (it costs a laptop CPU); a cluster keeps its own.
    ray.init(address=args.address, **({} if args.address else {"include_dashboard": False}))
  torch.manual_seed(args.seed)
  x, y = make_data(args.samples, args.seed)
  x_test, y_test = make_data(1024, args.seed + 1)
  shards = list(zip(np.array_split(x, args.workers), np.array_split(y, args.workers)))
  start = time.perf_counter()
  trainer = tb.ray.DataParallelTrainer(
    make_model, mse, tf.keras.optimizers.Adam(args.lr), shards, name="mlp"
  )
  ready = time.perf_counter()
  print(
    f"{args.workers} workers ready in {ready - start:.1f} s "
    f"({[len(s[0]) for s in shards]} samples each)",
    flush=True,
  )
  losses = []
  for step in range(args.steps):
    losses.append(trainer.step())
    if step % max(args.steps // 10, 1) == 0 or step == args.steps - 1:
      print(f"step {step:5d}  train loss {losses[-1]:.4f}", flush=True)
  seconds = time.perf_counter() - ready
  # The driver's TorchModule holds the trained weights; the workers hold
  # the same (they got them with the last broadcast).
  test_mse = float(mse(trainer.module, tf.constant(x_test), tf.constant(y_test)))
  baseline = float(np.mean((y_test - y.mean()) ** 2))
  workers_agree = all(
    np.array_equal(tb.ray.pull_weights(w)[k], v)
    for w in trainer.workers
    for k, v in trainer.module.get_weights().items()
  )
  results = {
    "workers": args.workers,
    "steps": args.steps,
    "samples": args.samples,
    "first_loss": losses[0],
    "final_loss": losses[-1],
    "test_mse": test_mse,
    "test_mse_predicting_mean": baseline,
    "steps_per_sec": args.steps / seconds,
    "workers_hold_driver_weights": workers_agree,
  }
  print(
    f"test MSE {test_mse:.4f} (predicting the mean gives {baseline:.4f}); "
    f"{results['steps_per_sec']:.1f} steps/s; workers hold the driver's "
    f"weights: {workers_agree}"
  )
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    path = tf.train.Checkpoint(model=trainer.module, optimizer=trainer.optimizer).save(
      os.path.join(args.out, "ckpt")
    )
    results["checkpoint"] = path
    with open(os.path.join(args.out, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
    print(f"wrote {args.out}/results.json and checkpoint {path}")
  trainer.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
