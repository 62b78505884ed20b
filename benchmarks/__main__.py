"""`python -m benchmarks [--quick] [--out DIR] [--threads N]`: run the suite."""

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks import suite  # noqa: E402


def _run_module(module, args):
  """`python -m module --threads N --out DIR`, a benchmark writing its own
  results into the suite's directory."""
  subprocess.run(
    [sys.executable, "-m", module, "--threads", str(args.threads), "--out", args.out],
    cwd=harness.ROOT,
    check=True,
  )


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
  parser.add_argument(
    "--quick",
    action="store_true",
    help="a smoke run of about a minute: fewer sizes, models, contenders, processes; no TD3",
  )
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  args = parser.parse_args(argv)

  harness.configure_threads(args.threads)
  device = "cuda" if torch.cuda.is_available() and tf.config.list_physical_devices("GPU") else "cpu"
  start = time.time()
  results = {"quick": args.quick, "environment": harness.environment(args.threads, device)}

  def log(message):
    print(f"[{time.time() - start:6.0f} s] {message}", flush=True)

  print(
    f"benchmarks on {device} ({results['environment']['cpu']}), "
    f"{args.threads} threads each, quick={args.quick}",
    flush=True,
  )
  log("exchange and per-call overhead (in this process)")
  results["exchange"] = suite.exchange(args.quick, device)
  results["overhead"] = suite.overhead(args.quick, device)
  models = ["small_mlp"] if args.quick else ["small_mlp", "cnn", "large_mlp"]
  results["train_steps"] = {}
  for model in models:
    log(f"training steps: {model}, a process per contender")
    results["train_steps"][model] = suite.train_steps(
      model, args.quick, device, args.threads, log=log
    )
  if not args.quick:
    log("TD3 train steps: examples/td3_pendulum.py, a process per backend")
    results["td3"] = suite.td3(args.quick, args.threads, log=log)
  if not args.quick:
    log("TD3 wall time, split: examples/td3_pendulum.py, a process per backend")
    _run_module("benchmarks.td3_wall", args)
  if not args.quick:
    log("TD3 train step with torch.compile on the torch side, a process per contender")
    _run_module("benchmarks.compiled_step", args)
  log("pure torch before and after 1,000 bridged calls")
  results["torch_after_bridge"] = suite.torch_after_bridge(args.quick, args.threads, log=log)
  if not args.quick:
    log("step breakdown: TD3 and small-MLP steps split phase by phase")
    _run_module("benchmarks.step_breakdown", args)
  if not args.quick:
    log("peak memory")
    results["peak_memory"] = {"large_mlp": suite.peak_memory("large_mlp", device)}
  results["failed_processes"] = harness.FAILURES
  results["headline"] = report.headline(results)
  results["decomposition"] = report.decomposition(results)
  results["targets"] = report.targets(results)
  results["floors"] = report.floors(results)
  results["seconds"] = time.time() - start
  print()
  print(report.table(results))
  path, plots = report.write(results, args.out)
  print(f"\nwrote {path} and {', '.join(plots)} in {results['seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
