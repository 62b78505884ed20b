"""Per-call cost of a bridged identity in a tf.function, timeline off and on.

`python benchmarks/timeline_cost.py` prints one JSON line of medians (us a
call, 15 timings of 300 calls): "off", "record" (inside
`tb.timeline(annotate=False)`), "annotate" (inside `tb.timeline()`),
"off_again". Run it alternated with an older checkout on PYTHONPATH to
compare "off" with a torchbridge that had no timeline (README, "Where the
time goes").
"""

import json
import time

import torch
import tensorflow as tf
import torchbridge as tb

torch.set_num_threads(2)
torch.set_num_interop_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(1)
f = tb.torch_function(lambda x: x, name="identity")
g = tf.function(lambda x: f(x))
x = tf.random.normal([64, 32])


def t(n=300, reps=15):
  s = []
  for _ in range(reps):
    a = time.perf_counter()
    for _ in range(n):
      g(x)
    s.append((time.perf_counter() - a) / n * 1e6)
  return sorted(s)[len(s) // 2]


for _ in range(100):
  g(x)
res = {"off": t()}
if hasattr(tb, "timeline"):
  with tb.timeline(annotate=False):
    res["record"] = t()
  with tb.timeline():
    res["annotate"] = t()
  res["off_again"] = t()
print(json.dumps(res))
