"""The recurrent PPO update through the bridge against its pure-torch twin.

Usage:
  python -m benchmarks.ppo_update [--rounds 3] [--iterations 12]
  python -m benchmarks.ppo_update --process {torchbridge,torch} ...

Each backend runs examples/ppo_lstm_cartpole.py's own `Run` (LSTM policy,
masked loss, the script's hyperparameters: 8 environments x 32 steps per
rollout, 20 updates per rollout over the padded sequences) in a process of
its own, for `--iterations` rollouts; every `agent.update` call (one
`tf.function` PPO update: the bridged forward and backward of both LSTMs,
the masked loss, gradient clipping, Keras Adam; or the same in torch) is
timed, the first `WARM_UPDATES` (the trace) left out; then, on the last
batch, the update's first part alone (forward, masked loss, gradients; the
rest is clipping and the optimizer). Rounds alternate the
backends, as the main job's benchmark does (`benchmarks.suite.td3`), and
the figure is the median over processes. Writes
benchmarks/results/ppo_update.json and prints the ratio.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402

sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
import ppo_lstm_cartpole  # noqa: E402

WARM_UPDATES = 20  # the first rollout's updates: tracing and first calls
RESULTS = os.path.join(harness.ROOT, "benchmarks", "results", "ppo_update.json")


def time_updates(backend, iterations, threads, seed=0):
  """Per-update durations (seconds) of `iterations` rollouts of the script."""
  torch.set_num_threads(threads)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  args = ppo_lstm_cartpole.parse_args(
    [
      "--backend",
      backend,
      "--seed",
      str(seed),
      "--out",
      os.devnull,
      "--steps",
      str(iterations * 256),
    ]
  )
  run = ppo_lstm_cartpole.Run(args)
  durations, update = [], run.agent.update
  batches = []

  def timed(batch, *a):
    batches[:] = [batch]
    start = time.perf_counter()
    stats = update(batch, *a)
    durations.append(time.perf_counter() - start)
    return stats

  run.agent.update = timed
  obs = state = starts = None
  episode_returns = np.zeros(run.hyper.n_envs)
  for _ in range(iterations):
    obs, state, starts, last_values, _ = run.collect(obs, state, starts, episode_returns)
    run.learn(last_values)
    run.progress["env_step"] += run.hyper.n_steps * run.hyper.n_envs
  return durations, _loss_and_gradients_ms(run.agent, batches[0])


def _loss_and_gradients_ms(agent, batch, calls=60):
  """Median ms of the update's first part alone, on the last batch: the
  forward, the masked loss and the gradients (the rest of an update is
  the clipping and the optimizer)."""
  if isinstance(agent.model, torch.nn.Module):  # the pure-torch twin
    batch_torch = tf.nest.map_structure(torch.from_numpy, batch)

    def part():
      agent.model.zero_grad()
      agent.loss(batch_torch, 0.1)[0].backward()
  else:
    variables = agent.model.trainable_variables

    @tf.function
    def gradients(batch_tf):
      with tf.GradientTape() as tape:
        loss, _ = agent.loss(batch_tf, tf.constant(0.1))
      return tape.gradient(loss, variables)

    batch_tf = tf.nest.map_structure(tf.constant, batch)
    part = lambda: [g.numpy() for g in gradients(batch_tf)]  # noqa: E731
  part()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    part()
    times.append(time.perf_counter() - start)
  return float(np.median(times) * 1e3)


def process_main(args):
  durations, loss_and_gradients_ms = time_updates(args.process, args.iterations, args.threads)
  timed = np.asarray(durations[WARM_UPDATES:]) * 1e3
  print(
    json.dumps(
      {
        "backend": args.process,
        "pid": os.getpid(),
        "ms_per_update": float(np.median(timed)),
        "ms_loss_and_gradients": loss_and_gradients_ms,
        "mean_ms_per_update": float(timed.mean()),
        "updates_timed": int(timed.size),
      }
    )
  )


def driver_main(args):
  backends = {"torchbridge": "torchbridge", "pure torch": "torch"}
  jobs = {
    name: (
      lambda b=backend: harness.run_process(
        "benchmarks.ppo_update",
        ["--process", b, "--iterations", args.iterations, "--threads", args.threads],
        quiet_wait=args.quiet_wait,
      )
    )
    for name, backend in backends.items()
  }
  runs = harness.alternated(jobs, rounds=args.rounds, log=print)
  results = {
    name: harness.over_processes(records, "ms_per_update") for name, records in runs.items()
  }
  for name, records in runs.items():  # the update's first part, alone
    results[name]["ms_loss_and_gradients"] = float(
      np.median([r["ms_loss_and_gradients"] for r in records])
    )
  ratio = results["torchbridge"]["ms_per_update"] / results["pure torch"]["ms_per_update"]
  out = {
    "ppo_update": results,
    "ratio_torchbridge_over_torch": ratio,
    "environment": harness.environment(args.threads, "cpu"),
  }
  os.makedirs(os.path.dirname(args.results), exist_ok=True)
  with open(args.results, "w") as f:
    json.dump(out, f, indent=1)
  for name, r in results.items():
    print(
      f"{name:12s} {r['ms_per_update']:7.2f} ms per PPO update "
      f"(processes {r['min']:.2f}-{r['max']:.2f}); forward, loss and "
      f"gradients alone {r['ms_loss_and_gradients']:.2f} ms"
    )
  print(f"torchbridge / pure torch: {ratio:.2f}x  -> {args.results}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--process", choices=("torchbridge", "torch"))
  p.add_argument("--iterations", type=int, default=12)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--threads", type=int, default=1)
  p.add_argument("--quiet-wait", type=float, default=harness.QUIET_MAX_WAIT)
  p.add_argument("--results", default=RESULTS)
  args = p.parse_args(argv)
  (process_main if args.process else driver_main)(args)


if __name__ == "__main__":
  main()
