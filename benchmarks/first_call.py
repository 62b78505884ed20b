"""The README's first example in TF-first order: times its first graph call.

`python benchmarks/first_call.py [--run auto|torch]` prints one JSON line:
the first training step's time inside a `tf.function` (tracing, the
native op's build or load, the run; with the default runner, the capture:
`torch.export`, the translation and its check against torch), the imports' time, how long loading the op took, whether
this process built it, and which op is active. A standalone script (no
imports from the repository), so the user-install venv runs it as it is:
`make test-user` prints its figures, `benchmarks/build_time.py` and
tests/test_native_cli.py run it in processes of their own.
"""

import json
import sys
import time

started = time.perf_counter()
# pylint: disable=wrong-import-position,wrong-import-order
import tensorflow as tf
import torchbridge as tb
import torch

from torchbridge._native import _loader
from torchbridge._native import _build

imported = time.perf_counter()

RUN = sys.argv[sys.argv.index("--run") + 1] if "--run" in sys.argv else "auto"
actor = tb.TorchModule(
  torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)),
  name="actor",
  run=RUN,
)
opt = tf.keras.optimizers.Adam(1e-3)


@tf.function
def train_step(obs):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(actor(obs) ** 2)
  grads = tape.gradient(loss, actor.trainable_variables)
  opt.apply_gradients(zip(grads, actor.trainable_variables))
  return loss


_load = _loader.load
load_seconds = []


def _timed_load():
  if not _loader._tried:  # pylint: disable=protected-access
    begin = time.perf_counter()
    try:
      return _load()
    finally:
      load_seconds.append(time.perf_counter() - begin)
  return _load()


_loader.load = _timed_load
obs = tf.random.normal([32, 3])
before = time.perf_counter()
loss = float(train_step(obs))
first_call = time.perf_counter() - before
before = time.perf_counter()
float(train_step(obs))
second_call = time.perf_counter() - before
print(
  json.dumps(
    {
      "run": RUN,
      "first_call_s": round(first_call, 3),
      "second_call_ms": round(second_call * 1e3, 3),
      "load_s": round(load_seconds[0], 3) if load_seconds else None,
      "import_s": round(imported - started, 3),
      "builds": _build.build_count,
      "native": _loader.available(),
      "complete": _loader.has_torch_interop(),
      "status": _loader.status(),
      "torch": torch.__version__,
      "loss": loss,
    }
  )
)
