"""One contender's training step, timed in a process of its own.

Usage:
  python -m benchmarks.step_process MODEL CONTENDER [--calls N]
      [--repeats R] [--threads T] [--device cpu|cuda]

torch's intra-op OpenMP pool is a team per calling thread, and a process
holding several teams (one per thread that ran torch code) slows every
parallel region in it: a contender timed beside another is timed in the
other's conditions. Here the process builds one contender, warms it up,
and times `repeats` x `calls` steps. Prints one JSON line: the per-call
time of each repeat, their median, the process id, the thread settings.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks import train_step  # noqa: E402
from torchbridge._native import _loader  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.step_process", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("model", choices=["small_mlp", "cnn", "large_mlp"])
  parser.add_argument("contender", choices=train_step.CONTENDERS)
  parser.add_argument(
    "--calls", type=int, default=0, help="steps per repeat; 0: as many as take ~0.25 s"
  )
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
  args = parser.parse_args(argv)

  harness.configure_threads(args.threads)
  step = train_step.build(args.model, args.contender, args.device)
  sync = torch.cuda.synchronize if args.device == "cuda" else None
  calls = harness.calls_for(step, 0.25, sync=sync)  # also the warm-up
  calls = args.calls or calls
  samples_us = harness.timed_repeats(step, args.repeats, calls, sync=sync)
  summary = harness.summarize(samples_us)
  print(
    json.dumps(
      {
        "pid": os.getpid(),
        "model": args.model,
        "contender": args.contender,
        "calls": calls,
        "repeats": args.repeats,
        "median_us": summary["median_us"],
        "samples_us": summary["samples_us"],
        "native": _loader.available(),
        "threads": {
          "torch_intra": torch.get_num_threads(),
          "tf_intra": tf.config.threading.get_intra_op_parallelism_threads(),
        },
      }
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
