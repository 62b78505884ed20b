"""Does the user's own torch code get slower once the bridge has run?

Usage: python -m benchmarks.torch_after_bridge [--threads T] [--calls N]

In one process (this measurement is about the process the bridge leaves
behind): a pure-torch small-MLP forward and backward on the main thread is
timed, then `calls` bridged calls are made (a `tf.function` training step
of a `tb.TorchModule`: its forward and its backward, two bridged calls per
step), then the pure-torch loop is timed again at once, and once more after
`PAUSE_SECONDS` (the bridge's torch thread ends after 0.2 s without work).
Prints one JSON line: the three medians (us per forward and backward) and
the process id.
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

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import models  # noqa: E402

PAUSE_SECONDS = 0.5
# Short timings (7 x 30 steps, ~0.1 s in all): "right after" must end before
# the torch thread's 0.2 s idle timeout.
REPEATS, CALLS = 7, 30


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.torch_after_bridge", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument(
    "--calls", type=int, default=1000, help="bridged calls between the timings (two per step)"
  )
  args = parser.parse_args(argv)
  harness.configure_threads(args.threads)

  torch.manual_seed(0)
  shape, _, shape_target = models.batch_shapes("small_mlp")
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal(shape, dtype=np.float32)
  y_np = rng.standard_normal(shape_target, dtype=np.float32)
  model_torch = models.torch_model("small_mlp")
  x_torch, y_torch = torch.from_numpy(x_np), torch.from_numpy(y_np)

  def torch_forward_backward():
    model_torch.zero_grad(set_to_none=True)
    torch.mean((model_torch(x_torch) - y_torch) ** 2).backward()

  bridged = tb.TorchModule(models.torch_model("small_mlp"), name="bridged")
  x_tf, y_tf = tf.constant(x_np), tf.constant(y_np)

  @tf.function
  def bridged_grads():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((bridged(x_tf) - y_tf) ** 2)
    return tape.gradient(loss, bridged.trainable_variables)

  harness.calls_for(torch_forward_backward, 0.5)  # warm-up
  before = harness.timed_repeats(torch_forward_backward, REPEATS, CALLS)
  for _ in range(args.calls // 2):
    bridged_grads()
  right_after = harness.timed_repeats(torch_forward_backward, REPEATS, CALLS)
  time.sleep(PAUSE_SECONDS)
  later = harness.timed_repeats(torch_forward_backward, REPEATS, CALLS)
  print(
    json.dumps(
      {
        "pid": os.getpid(),
        "bridged_calls": 2 * (args.calls // 2),
        "before_us": float(np.median(before)),
        "right_after_us": float(np.median(right_after)),
        "after_pause_us": float(np.median(later)),
        "pause_s": PAUSE_SECONDS,
        "samples_us": {"before": before, "right_after": right_after, "after_pause": later},
      }
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
