"""One process of `benchmarks.per_call_venvs`: the per-call figures here.

Runs `suite.overhead` (the identity through each path, and the bare ops it
is measured against) and prints one JSON line with it and the set-up that
produced it: torch, TF, which native op is active, and where torchbridge
was imported from.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import suite  # noqa: E402


def main():
  threads = int(sys.argv[1]) if len(sys.argv) > 1 else (os.cpu_count() or 1)
  harness.configure_threads(threads)
  quick = "--quick" in sys.argv
  overhead = suite.overhead(quick, "cpu")
  print(
    json.dumps(
      {
        "torch": torch.__version__,
        "tensorflow": tf.__version__,
        "torchbridge_file": torchbridge.__file__,
        "native": _loader.available(),
        "complete": _loader.has_torch_interop(),
        "status": _loader.status(),
        "overhead": {name: t["median_us"] for name, t in overhead.items()},
      }
    )
  )


if __name__ == "__main__":
  main()
