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
timed, the first `WARM_UPDATES` (the trace) left out. Rounds alternate the
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
  args = ppo_lstm_cartpole.parse_args([
      "--backend", backend, "--seed", str(seed), "--out", os.devnull,
      "--steps", str(iterations * 256)])
  run = ppo_lstm_cartpole.Run(args)
  durations, update = [], run.agent.update

  def timed(*a):
    start = time.perf_counter()
    stats = update(*a)
    durations.append(time.perf_counter() - start)
    return stats

  run.agent.update = timed
  obs = state = starts = None
  episode_returns = np.zeros(run.hyper.n_envs)
  for _ in range(iterations):
    obs, state, starts, last_values, _ = run.collect(obs, state, starts, episode_returns)
    run.learn(last_values)
    run.progress["env_step"] += run.hyper.n_steps * run.hyper.n_envs
  return durations


def process_main(args):
  durations = time_updates(args.process, args.iterations, args.threads)
  timed = np.asarray(durations[WARM_UPDATES:]) * 1e3
  print(json.dumps({"backend": args.process, "pid": os.getpid(),
                    "ms_per_update": float(np.median(timed)),
                    "mean_ms_per_update": float(timed.mean()),
                    "updates_timed": int(timed.size)}))


def driver_main(args):
  backends = {"torchbridge": "torchbridge", "pure torch": "torch"}
  jobs = {name: (lambda b=backend: harness.run_process("benchmarks.ppo_update", [
      "--process", b, "--iterations", args.iterations, "--threads", args.threads],
      quiet_wait=args.quiet_wait)) for name, backend in backends.items()}
  runs = harness.alternated(jobs, rounds=args.rounds, log=print)
  results = {name: harness.over_processes(records, "ms_per_update")
             for name, records in runs.items()}
  ratio = results["torchbridge"]["ms_per_update"] / results["pure torch"]["ms_per_update"]
  out = {"ppo_update": results, "ratio_torchbridge_over_torch": ratio,
         "environment": harness.environment(args.threads, "cpu")}
  os.makedirs(os.path.dirname(args.results), exist_ok=True)
  with open(args.results, "w") as f:
    json.dump(out, f, indent=1)
  for name, r in results.items():
    print(f"{name:12s} {r['ms_per_update']:7.2f} ms per PPO update "
          f"(processes {r['min']:.2f}-{r['max']:.2f})")
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
