"""The bridge's Python per graph call, without TF around it.

Usage: python -m benchmarks.callback_cost [--calls N]

Traces a bridged identity (`tb.torch_function`) into a `tf.function` on the
native op, keeps the callback the op would call (the bridge's whole Python
side of a call: binding, the torch call, output checks, the state saved for
a backward), and calls it in a loop on a torch tensor, as the kernel does:
once as an inference call (nothing consumes the op's handle, so nothing is
saved) and once as a training forward; each both back to back (warm
caches) and after a pass over 8 MB of memory (evicting the CPU's caches, as
the TF work between the bridged calls of a step does), against a callback
that only hands its tensor back. And, to see a call's cost without the
`tf.function` call around it, the bridged identity and a bare native op
called `LOOP_CALLS` times in one `tf.while_loop` (one `tf.function` run),
per call. Prints one JSON line (us per call). The op's kernel, its torch
tensors and TF's graph around it are what a bridged call costs beyond the
callback (`make bench`'s overhead table).
"""

import argparse
import json
import os
import statistics
import sys
import time
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from torchbridge._native import _op  # noqa: E402


def bridged_callback():
  """The native op's callback of a bridged identity, as traced."""
  captured = []
  call = _op.call

  def spy(callback, *args, **kwargs):
    captured.append(callback)
    return call(callback, *args, **kwargs)

  _op.call = spy
  try:
    identity = tb.torch_function(lambda x: x, name="identity")
    tf.function(identity).get_concrete_function(tf.zeros([64, 32]))
  finally:
    _op.call = call
  return captured[-1]


EVICT_BYTES = 8 * 1024 * 1024
LOOP_CALLS = 2000


def after_eviction(fn, calls):
  """The median time of `fn()` (us), each call after a pass over
  `EVICT_BYTES` of memory, untimed."""
  memory = np.ones(EVICT_BYTES // 8)
  times = []
  for _ in range(calls):
    memory.sum()
    start = time.perf_counter_ns()
    fn()
    times.append(time.perf_counter_ns() - start)
  return statistics.median(times) / 1e3


def in_a_loop(rounds=9):
  """us per call of a bridged identity and of a bare native op, each called
  `LOOP_CALLS` times in one tf.while_loop (medians over `rounds` runs)."""
  identity = tb.torch_function(lambda x: x, name="identity")
  bodies = {
    "loop_bare_op_us": lambda v: _op.call(list, [v], [tf.float32], [v.shape])[0],
    "loop_bridged_us": identity,
  }
  x_tf = tf.random.normal([64, 32])
  loops = {}
  for key, body in bodies.items():

    def run(x, body=body):
      return tf.while_loop(
        lambda i, v: i < LOOP_CALLS, lambda i, v: (i + 1, body(v)), (tf.constant(0), x)
      )[1]

    loops[key] = tf.function(run)
    loops[key](x_tf)
  times = {key: [] for key in loops}
  for _ in range(rounds):
    for key, loop in loops.items():
      start = time.perf_counter()
      loop(x_tf)
      times[key].append((time.perf_counter() - start) / LOOP_CALLS * 1e6)
  return {key: statistics.median(t) for key, t in times.items()}


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.callback_cost", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--calls", type=int, default=20000)
  args = parser.parse_args(argv)
  if not _loader.available():
    print(f"the native op is not available: {_loader.status()}")
    return 1
  callback = bridged_callback()
  x_torch = torch.randn(64, 32)
  result = {"pid": os.getpid()}
  # unused=(0,): nothing consumes the handle (an inference call); None: not
  # known, so state is saved for a backward.
  for label, unused in (("inference_us", (0,)), ("training_forward_us", None)):
    callback([x_torch], unused)
    seconds = timeit.timeit(lambda u=unused: callback([x_torch], u), number=args.calls)
    result[label] = 1e6 * seconds / args.calls
    cold = label.replace("_us", "_after_eviction_us")
    result[cold] = after_eviction(lambda u=unused: callback([x_torch], u), args.calls // 10)
  # The least a torch_tensors callback does: hand its tensor back.
  result["hand_back_after_eviction_us"] = after_eviction(
    lambda: (lambda args, unused: [None, *args])([x_torch], None), args.calls // 10
  )
  result.update(in_a_loop())
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
