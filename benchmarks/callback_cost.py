"""The bridge's Python per graph call, without TF around it.

Usage: python -m benchmarks.callback_cost [--calls N]

Traces a bridged identity (`tb.torch_function`) into a `tf.function` on the
native op, keeps the callback the op would call (the bridge's whole Python
side of a call: binding, the torch call, output checks, the state saved for
a backward), and calls it in a loop on a torch tensor, as the kernel does:
once as an inference call (nothing consumes the op's handle, so nothing is
saved) and once as a training forward. Prints one JSON line (us per call).
The op's kernel, its torch tensors and TF's graph around it are what a
bridged call costs beyond this (`make bench`'s overhead table).
"""

import argparse
import json
import os
import sys
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
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
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
