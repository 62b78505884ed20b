"""What torch's weight layout costs a step compiled by XLA on the CPU.

Usage:
  python -m benchmarks.weight_layout [--processes 3] [--rounds 15] [--out DIR]
  python -m benchmarks.weight_layout --one   (one process)

A torch `Linear` holds its weight `(out, in)` and computes `x @ W.T`; a
Keras `Dense` holds its kernel `(in, out)` and computes `x @ W`. The
default runner's translation reads the torch weight where it is (the
variable views the parameter's memory). Written `x @ W.T`
(`matmul(transpose_b=True)`, the translation's form without XLA), XLA's
CPU dots read it transposed; under XLA the translation writes
`(W @ x.T).T`. Here one TD3-critic-shaped step (4 -> 256 -> 256 -> 1, batch 256: a target
network's forward, the online network's forward and backward, Keras Adam),
plain TF ops under `tf.function(jit_compile=True)`, is built three times,
the same random weights stored `(out, in)` and used in either form, or
stored `(in, out)`; they take turns in blocks of 200 steps, `--rounds`
rounds, in each of `--processes` processes. The ratio is per round, its
median per process, then over the processes. No torch and no bridge:
only the layout differs. Writes weight_layout.json and weight_layout.md.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402,F401  (before TensorFlow, as everywhere here)
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402

TORCH_LAYOUT = "(out, in), x @ W.T (torch's layout, the translation's form without XLA)"
TORCH_LAYOUT_XLA_FORM = "(out, in), (W @ x.T).T (torch's layout, the translation's form under XLA)"
KERAS_LAYOUT = "(in, out), x @ W (Keras' layout)"
FORMS = (TORCH_LAYOUT, TORCH_LAYOUT_XLA_FORM, KERAS_LAYOUT)
DIMS = ((4, 256), (256, 256), (256, 1))
BATCH, BLOCK = 256, 200


def _step(form, seed=0):
  torch_layout = form != KERAS_LAYOUT
  rng = np.random.default_rng(seed)

  def weights():
    made = []
    for n_in, n_out in DIMS:
      w = rng.standard_normal((n_in, n_out)).astype(np.float32) * 0.05
      made += [
        tf.Variable(w.T.copy() if torch_layout else w),
        tf.Variable(np.zeros(n_out, np.float32)),
      ]
    return made

  online, target = weights(), weights()
  optimizer = tf.keras.optimizers.Adam(1e-4)
  optimizer.build(online)
  x = tf.constant(rng.standard_normal((BATCH, DIMS[0][0])).astype(np.float32))
  y = tf.constant(rng.standard_normal((BATCH, 1)).astype(np.float32))

  def net(h, ws):
    for k in range(len(DIMS)):
      if form == TORCH_LAYOUT_XLA_FORM:
        product = tf.transpose(tf.matmul(ws[2 * k], h, transpose_b=True))
      else:
        product = tf.matmul(h, ws[2 * k], transpose_b=torch_layout)
      h = tf.nn.bias_add(product, ws[2 * k + 1])
      if k < len(DIMS) - 1:
        h = tf.nn.relu(h)
    return h

  @tf.function(jit_compile=True)
  def step():
    goal = tf.stop_gradient(net(x, target))
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(net(x, online) - goal - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, online), online))
    return loss

  return step


def one(rounds):
  """One process's blocks (its threads set by `main`, before TF starts)."""
  steps = {form: _step(form) for form in FORMS}
  timings = harness.interleaved(
    {name: lambda step=step: float(step()) for name, step in steps.items()},
    repeats=rounds,
    calls=BLOCK,
    warmup=50,
  )
  blocks = {name: timings[name]["samples_us"] for name in steps}
  return {"blocks_us": blocks, "tensorflow": tf.__version__}


def summarize(records):
  """Per torch-layout form: its per-round ratio to the Keras layout's block,
  the median per process, then over the processes."""
  ratios = {}
  for form in (TORCH_LAYOUT, TORCH_LAYOUT_XLA_FORM):
    per_process = [
      float(np.median(np.array(r["blocks_us"][form]) / np.array(r["blocks_us"][KERAS_LAYOUT])))
      for r in records
    ]
    ratios[form] = {"per_process": per_process, "ratio": float(np.median(per_process))}
  return {
    "ratio_to_keras": ratios,
    "median_us": {
      name: float(np.median([np.median(r["blocks_us"][name]) for r in records])) for name in FORMS
    },
  }


def markdown(data):
  source, result = data["source"], data["result"]
  changed = (
    f", with changes to {', '.join(source['changed_since'])}" if source["changed_since"] else ""
  )
  lines = [
    f"Measured at {source['commit'][:10]}{changed} (TensorFlow {data['tensorflow']}, 2 "
    f"threads): a TD3-critic-shaped step compiled by XLA, plain TF ops, batch {BATCH}, the "
    f"three forms taking turns in blocks of {BLOCK} steps, {data['rounds']} rounds, in each "
    f"of {data['processes']} processes. The ratio: per round against the Keras layout's "
    "block, the median per process, then over the processes (each process's after the slash).",
    "",
    "| weights stored, product written | us a step (median over the processes) | / Keras' layout |",
    "|---|---|---|",
  ]
  for name, value in result["median_us"].items():
    ratio = result["ratio_to_keras"].get(name)
    cell = (
      f"{ratio['ratio']:.3f}x (" + " / ".join(f"{v:.3f}" for v in ratio["per_process"]) + ")"
      if ratio
      else "1.000x"
    )
    lines.append(f"| {name} | {value:.1f} | {cell} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.weight_layout", description=__doc__)
  parser.add_argument("--one", action="store_true")
  parser.add_argument("--processes", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  if args.one:
    harness.configure_threads(2)
    print(json.dumps(one(args.rounds)))
    return 0
  records = [
    harness.run_process("benchmarks.weight_layout", ["--one", "--rounds", args.rounds])
    for _ in range(args.processes)
  ]
  data = {
    "source": harness.environment(2, "cpu")["source"],
    "processes": args.processes,
    "rounds": args.rounds,
    "tensorflow": records[0]["tensorflow"],
    "result": summarize(records),
    "records": records,
  }
  harness.write_results(args.out, "weight_layout", data, markdown(data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
