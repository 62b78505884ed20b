"""What tracing a tf.function around a Hugging Face model costs.

GPT-2's masking code reads tensor values, so its output specs cannot come
from meta tensors: torchbridge runs the forward for real on stand-in values
while tracing. This measures, for a tiny GPT-2 (`tests/test_transformers.py`'s)
and a small MLP for comparison: the seconds `get_concrete_function` takes
(a fresh tf.function each time, median of 5), how many forwards ran on meta
tensors and how many for real while tracing (counted by a forward pre-hook),
and the seconds of one call after tracing.

  python -m benchmarks.trace_cost [--out FILE.json]
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch  # before tensorflow
import tensorflow as tf

import torchbridge as tb


def _gpt2():
  import transformers  # pylint: disable=import-outside-toplevel

  config = transformers.GPT2Config(
    n_layer=2,
    n_head=2,
    n_embd=32,
    vocab_size=97,
    n_positions=32,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    use_cache=False,
  )
  model = transformers.GPT2LMHeadModel(config)
  ids = np.random.default_rng(0).integers(0, 97, (2, 8)).astype(np.int64)
  return model, {"input_ids": ids}, lambda out: out["logits"]


def _mlp():
  model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
  x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
  return model, {"input": x}, lambda out: out


def measure(build, dynamic_batch, repeats=5):
  torch.manual_seed(0)
  model, inputs, first = build()
  runs = {"meta": 0, "real": 0}

  def count(module, args, kwargs):
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    runs["meta" if tensors and tensors[0].is_meta else "real"] += 1

  model.register_forward_pre_hook(count, with_kwargs=True)
  bridged = tb.TorchModule(model, name="model")
  specs = {
    k: tf.TensorSpec(
      [None if dynamic_batch else v.shape[0]] + list(v.shape[1:]), tf.as_dtype(v.dtype)
    )
    for k, v in inputs.items()
  }
  inputs_tf = {k: tf.constant(v) for k, v in inputs.items()}

  def call(kw):
    if set(kw) == {"input"}:
      return first(bridged(kw["input"], training=False))
    return first(bridged(**kw, training=False))

  trace_s, counts = [], None
  for _ in range(repeats):
    runs.update(meta=0, real=0)
    fn = tf.function(call)
    start = time.perf_counter()
    concrete = fn.get_concrete_function(specs)
    trace_s.append(time.perf_counter() - start)
    counts = dict(runs)
  concrete(inputs_tf)  # warm
  start = time.perf_counter()
  for _ in range(20):
    concrete(inputs_tf)
  call_s = (time.perf_counter() - start) / 20
  return {
    "trace_s_median": statistics.median(trace_s),
    "trace_s": trace_s,
    "forwards_while_tracing": counts,
    "call_s": call_s,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  results = {}
  for name, build in (("gpt2", _gpt2), ("small_mlp", _mlp)):
    for dynamic in (False, True):
      key = f"{name}, batch {'unknown' if dynamic else 'static'}"
      results[key] = measure(build, dynamic)
      r = results[key]
      print(
        f"{key:32s} trace {r['trace_s_median'] * 1e3:8.1f} ms  "
        f"forwards while tracing {r['forwards_while_tracing']}  "
        f"call {r['call_s'] * 1e3:6.2f} ms"
      )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
