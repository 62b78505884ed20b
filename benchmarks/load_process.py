"""One contender's training step or eager policy call, timed in a process
of its own (benchmarks/load.py starts it quiet or beside busy processes).

Usage:
  python -m benchmarks.load_process CONTENDER {step,eager} [--seconds S]
      [--repeats R] [--threads T]

`step`: one Adam step of the 3-256-256-1 MLP on a batch of 64 (forward,
MSE loss, backward, update) in a `tf.function` (pure torch: its own loop).
`eager`: one eager call on a [1, 3] state with its result read as numpy,
as an RL loop picks each action (pure torch: under `torch.no_grad()`).
Prints one JSON line: the per-call time of each repeat and their median.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import train_step  # noqa: E402

KERAS = "keras"
BRIDGE = "torchbridge (default: TF runner)"
BRIDGE_CPP = "torchbridge run='torch' (C++ runner)"
BRIDGE_PY = "torchbridge run='torch' (Python path)"
PURE_TORCH = "pure torch"
CONTENDERS = (KERAS, BRIDGE, BRIDGE_CPP, BRIDGE_PY, PURE_TORCH)
MODEL = "ddpg_mlp"


def _bridged(contender):
  torch.manual_seed(0)
  net = models.torch_model(MODEL)
  if contender == BRIDGE:
    return tb.keras.TorchLayer(net)
  layer = tb.keras.TorchLayer(net, run="torch")
  if contender == BRIDGE_PY:
    layer._runners.torch_runner.enabled = False  # pylint: disable=protected-access
  return layer


def build(contender, what):
  """The zero-argument function timed for `contender`."""
  rng = np.random.default_rng(0)
  shape, _, target = models.batch_shapes(MODEL)
  x_np = rng.standard_normal(shape, dtype=np.float32)
  y_np = rng.standard_normal(target, dtype=np.float32)
  state_np = rng.standard_normal((1, shape[1]), dtype=np.float32)
  if contender == PURE_TORCH:
    torch.manual_seed(0)
    if what == "eager":
      net = models.torch_model(MODEL)
      state_torch = torch.from_numpy(state_np)

      def act():
        with torch.no_grad():
          return net(state_torch).numpy()

      return act
    return train_step._torch_step(MODEL, x_np, y_np, "cpu", optimizer=True)  # pylint: disable=protected-access
  model = models.keras_model(MODEL) if contender == KERAS else _bridged(contender)
  if what == "eager":
    state_tf = tf.constant(state_np)
    return lambda: model(state_tf).numpy()
  step = train_step._tf_step(model, tf.constant(x_np), tf.constant(y_np))  # pylint: disable=protected-access
  return tf.function(step)


def renice(increment):
  """Adds `increment` to the niceness of every thread of this process (on
  Linux niceness is per thread, and threads made later inherit it), as
  `nice` at the start would, but after the set-up."""
  for tid in os.listdir("/proc/self/task"):
    tid = int(tid)
    try:
      os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (ProcessLookupError, PermissionError):
      pass  # a thread that ended meanwhile


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.load_process", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("contender", choices=CONTENDERS)
  parser.add_argument("what", choices=["step", "eager"])
  parser.add_argument("--seconds", type=float, default=0.3, help="time per repeat")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument(
    "--timeline",
    action="store_true",
    help="record the bridge's phases (tb.timeline) while timing; per-step totals",
  )
  parser.add_argument(
    "--nice", type=int, default=0, help="niceness taken after the set-up, before the timing"
  )
  args = parser.parse_args(argv)

  harness.configure_threads(args.threads)
  fn = build(args.contender, args.what)
  harness.calls_for(fn, args.seconds)  # traces and warms up at the start's niceness
  if args.nice:
    renice(args.nice)
  calls = harness.calls_for(fn, args.seconds)  # sized under the conditions timed
  phases_us = None
  if args.timeline:
    with tb.timeline(annotate=False) as recorded:
      samples_us = harness.timed_repeats(fn, args.repeats, calls)
    steps = args.repeats * calls
    phases_us = {name: total / steps for name, (_, total) in recorded.totals_us().items()}
  else:
    samples_us = harness.timed_repeats(fn, args.repeats, calls)
  summary = harness.summarize(samples_us)
  print(
    json.dumps(
      {
        "pid": os.getpid(),
        "nice": os.nice(0),
        "thread_nices": sorted(
          {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
        ),
        "contender": args.contender,
        "what": args.what,
        "calls": calls,
        "median_us": summary["median_us"],
        "samples_us": summary["samples_us"],
        "mean_us": float(sum(summary["samples_us"]) / len(summary["samples_us"])),
        "phases_us_per_step": phases_us,
      }
    )
  )


if __name__ == "__main__":
  main()
