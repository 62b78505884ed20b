"""`python -m benchmarks.ray_scaling [--quick]`: what torchbridge.ray costs and gains.

Measures, on a local Ray (all of this machine's CPUs, driver included):
1. Weight broadcast of a 10M-parameter module (40 MB of float32) to 1 and 2
   `TorchModuleWorker` actors: `tb.ray.broadcast_weights` (one `ray.put`,
   then every actor's `set_weights`) until every actor holds the weights;
   the `put_weights` part alone; and, for comparison, the naive way
   (`get_weights()` once, the dict passed by value to each actor's call,
   which Ray serializes once per actor).
2. Steps per second of `tb.ray.DataParallelTrainer` on one global batch,
   split over 1 and 2 actors, against the same training step in one
   process without Ray.

Writes benchmarks/results/ray_scaling.json (or --out).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import numpy as np  # noqa: E402
import ray  # noqa: E402
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402

PARAMS_10M = 10 * (1000 * 1000 + 1000)


def big_module():
  """Ten 1000x1000 linear layers: 10,010,000 float32 parameters (40 MB)."""
  return torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(10)])


def mlp():
  """The data-parallel benchmark's model: 256-512-512-10, 400k parameters."""
  return torch.nn.Sequential(
    torch.nn.Linear(256, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
  )


def cross_entropy(module, x, labels):
  logits = module(x, training=True)
  return tf.reduce_mean(
    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
  )


def _stats(samples):
  samples = sorted(samples)
  return {
    "median": float(np.median(samples)),
    "p25": float(np.percentile(samples, 25)),
    "p75": float(np.percentile(samples, 75)),
    "samples": [float(s) for s in samples],
  }


def _threads_options(threads):
  """Actor options: `threads` torch and TF threads, no CPU reservation.

  The broadcast's actor groups are alive at once, so that their timings
  can be interleaved (this machine's speed drifts by up to 2x from minute
  to minute); they reserve no CPUs, and their thread counts are set
  directly instead of through Ray's num_cpus.
  """
  return {
    "num_cpus": 0,
    "runtime_env": {
      "env_vars": {
        "OMP_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": "1",
      }
    },
  }


def _interleaved(contenders, repeats, calls):
  """Seconds per call of each contender, timed in rotating order."""
  names = list(contenders)
  samples = {name: [] for name in names}
  for name in names:
    contenders[name]()  # warm-up
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      start = time.perf_counter()
      for _ in range(calls):
        contenders[name]()
      samples[name].append((time.perf_counter() - start) / calls)
  return {name: _stats(s) for name, s in samples.items()}


def broadcast(repeats):
  """Seconds per broadcast of the 10M module to 1 and to 2 actors."""
  worker_cls = ray.remote(tb.ray.TorchModuleWorker).options(**_threads_options(1))
  actors = {n: [worker_cls.remote(big_module, name="big") for _ in range(n)] for n in (1, 2)}
  learner = tb.TorchModule(big_module(), name="big")
  for group in actors.values():
    ray.get([a.get_weights.remote() for a in group])  # started

  def one_put(group):
    return lambda: ray.get(tb.ray.broadcast_weights(learner, group))

  def by_value(group):
    # The naive way: the weights copied out of TF once and passed by value,
    # which Ray serializes once per actor call.
    def send():
      weights_np = learner.get_weights()
      ray.get([a.set_weights.remote(weights_np) for a in group])

    return send

  contenders = {"put_weights_s": lambda: tb.ray.put_weights(learner)}
  for n, group in actors.items():
    contenders[f"broadcast_weights_{n}_actors_s"] = one_put(group)
    contenders[f"by_value_{n}_actors_s"] = by_value(group)
  results = _interleaved(contenders, repeats, calls=1)
  learner_np = learner.get_weights()
  ray.get(tb.ray.broadcast_weights(learner, actors[2]))
  for a in actors[1] + actors[2]:
    held = ray.get(a.get_weights.remote())
    assert all(np.array_equal(held[k], v) for k, v in learner_np.items())
    ray.kill(a)
  return results


def _data(global_batch, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(global_batch, 256)).astype(np.float32)
  labels = (np.abs(x[:, :10]).argmax(axis=1)).astype(np.int32)
  return x, labels


def make_trainer(num_actors, cpus_per_actor, global_batch):
  """DataParallelTrainer with the global batch split over `num_actors`.

  Each actor reserves `cpus_per_actor` Ray CPUs, and Ray sets its
  OMP_NUM_THREADS (torch's threads) to that number, as for any user.
  """
  x, labels = _data(global_batch)
  shards = list(zip(np.array_split(x, num_actors), np.array_split(labels, num_actors)))
  trainer = tb.ray.DataParallelTrainer(
    mlp,
    cross_entropy,
    tf.keras.optimizers.Adam(1e-3),
    shards,
    worker_options={"num_cpus": cpus_per_actor},
  )
  for _ in range(3):
    trainer.step()  # traces, builds the optimizer
  return trainer


def single_process_step(global_batch):
  """The same step in this process: one TorchModule, tf.function, no Ray."""
  x, labels = _data(global_batch)
  x_tf, labels_tf = tf.constant(x), tf.constant(labels)
  module = tb.TorchModule(mlp(), name="mlp")
  opt = tf.keras.optimizers.Adam(1e-3)
  opt.build(module.trainable_variables)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = cross_entropy(module, x_tf, labels_tf)
    grads = tape.gradient(loss, module.trainable_variables)
    opt.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  for _ in range(3):
    step()
  return lambda: step().numpy()


def _rates(step, steps, timings):
  rates = []
  for _ in range(timings):
    start = time.perf_counter()
    for _ in range(steps):
      step()
    rates.append(steps / (time.perf_counter() - start))
  return rates


def data_parallel(global_batch, steps, rounds, timings, cpus):
  """Steps/s: one process, and DataParallelTrainer on 1 and 2 actors.

  Each configuration runs alone (only its own actors alive), as a user
  would run it; the whole sequence is repeated `rounds` times, so that
  this machine's drifting speed touches every configuration alike.
  """
  configs = [(1, cpus), (1, 1), (2, 1)] if cpus >= 2 else [(1, 1)]
  rates = {"single_process": []}
  rates.update({f"{n}_actors_x_{c}_cpus": [] for n, c in configs})
  single = single_process_step(global_batch)
  for r in range(rounds):
    print(f"  round {r + 1} of {rounds}", flush=True)
    rates["single_process"] += _rates(single, steps, timings)
    for n, c in configs:
      trainer = make_trainer(n, c, global_batch)
      rates[f"{n}_actors_x_{c}_cpus"] += _rates(trainer.step, steps, timings)
      trainer.shutdown()
  return {name: _stats(r) for name, r in rates.items()}


@ray.remote(max_calls=1)  # a fresh process: torch reads its threads once
def _actor_threads():
  import torch  # noqa: F401  (as the workers do: before TensorFlow)
  import tensorflow as tf

  return {
    "torch_intra": torch.get_num_threads(),
    "tf_intra": tf.config.threading.get_intra_op_parallelism_threads(),
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    "TF_NUM_INTRAOP_THREADS": os.environ.get("TF_NUM_INTRAOP_THREADS"),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.ray_scaling", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--quick", action="store_true", help="a smoke run: fewer repeats and steps")
  parser.add_argument(
    "--address",
    default=None,
    help="Ray cluster address; default: a local Ray with all of this machine's CPUs",
  )
  parser.add_argument(
    "--out", default=os.path.join(os.path.dirname(__file__), "results", "ray_scaling.json")
  )
  args = parser.parse_args(argv)
  cpus = os.cpu_count() or 1
  if args.address:
    ray.init(address=args.address, log_to_driver=False)
  else:  # a Ray of our own, even where `ray start` runs one
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
  torch.set_num_threads(cpus)
  repeats = 3 if args.quick else 10  # broadcast timings, interleaved
  rounds, timings = (1, 2) if args.quick else (3, 4)  # trainer timings
  steps = 5 if args.quick else 20
  global_batch = 1024
  results = {
    "quick": args.quick,
    "environment": dict(
      harness.environment(torch.get_num_threads(), "cpu"),
      ray=ray.__version__,
      ray_cpus=ray.cluster_resources().get("CPU"),
    ),
    "notes": (
      f"{cpus} CPU cores shared by the driver and every actor: the "
      "driver's own work (averaging gradients, the optimizer step, "
      "serializing weights) runs on the same cores as the actors. "
      "Broadcast: the 1-actor and 2-actor groups are alive at once and "
      "timed in rotating order; their actors reserve no Ray CPUs and "
      "run 1 torch / TF thread each. Data-parallel steps/s: each "
      "configuration runs alone, its actors reserving num_cpus Ray CPUs "
      "each (Ray sets their OMP_NUM_THREADS to it), and the sequence of "
      "configurations is repeated in rounds, since this machine's speed "
      "drifts (up to 2x between minutes). Medians with p25/p75."
    ),
  }
  start = time.time()
  print("broadcast of 10M parameters to 1 and 2 actors", flush=True)
  results["broadcast_10M"] = dict(
    params=PARAMS_10M, megabytes=PARAMS_10M * 4 / 2**20, **broadcast(repeats)
  )
  print("data-parallel steps/s: one process, and 1 and 2 actors", flush=True)
  results["data_parallel"] = {
    "model": "MLP 256-512-512-10 (400k parameters), softmax cross-entropy, Adam",
    "global_batch": global_batch,
    "steps_per_timing": steps,
    "threads_in_actor_by_num_cpus": {
      c: ray.get(_actor_threads.options(num_cpus=c).remote()) for c in sorted({1, cpus})
    },
    "driver_threads": {"torch_intra": torch.get_num_threads()},
    "steps_per_s": data_parallel(global_batch, steps, rounds, timings, cpus),
  }
  results["seconds"] = time.time() - start
  ray.shutdown()
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print()
  print(table(results))
  print(f"\nwrote {args.out} in {results['seconds']:.0f} s")
  return 0


def table(results):
  """The results as markdown tables (medians; p25-p75 in brackets)."""
  b = results["broadcast_10M"]

  def ms(key):
    v = b[key]
    return f"{1e3 * v['median']:.0f} ms ({1e3 * v['p25']:.0f}-{1e3 * v['p75']:.0f})"

  lines = [
    f"| weight broadcast, 10M parameters ({b['megabytes']:.0f} MB) | 1 actor | 2 actors |",
    "|---|---|---|",
    "| `broadcast_weights` (one `ray.put`), until every actor holds "
    f"them | {ms('broadcast_weights_1_actors_s')} | "
    f"{ms('broadcast_weights_2_actors_s')} |",
    "| for comparison: `get_weights()` passed by value to each actor "
    f"| {ms('by_value_1_actors_s')} | {ms('by_value_2_actors_s')} |",
    f"| `put_weights` alone (copy out of TF + `ray.put`) | {ms('put_weights_s')} | |",
  ]
  d = results["data_parallel"]
  lines += [
    "",
    f"| data-parallel training, global batch {d['global_batch']} | steps/s |",
    "|---|---|",
  ]
  for name, v in d["steps_per_s"].items():
    lines.append(
      f"| {name.replace('_', ' ')} | {v['median']:.1f} ({v['p25']:.1f}-{v['p75']:.1f}) |"
    )
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
