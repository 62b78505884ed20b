"""The TD3 train step of `make demo` (XLA), its contenders paired in one process.

Usage:
  python -m benchmarks.paired_step [--processes 5] [--rounds 12] [--out DIR]
  python -m benchmarks.paired_step --one ORDER   (one process)

`benchmarks.runners` times each contender in processes of its own, as a
user's program runs; on this machine processes differ by 10-30% (which
cores, which pages, the other tenants), more than the gap between a
torchbridge step and the Keras port's under XLA. Here every contender
lives in the same process and they take turns, block by block (100 steps
each, `--rounds` rounds, the order rotating each round), so what differs
between processes cancels out of their ratios; `--processes` such
processes, each building the contenders in a different order. The ratios
are per round (each contender's block against the Keras port's block of
the same round), their median per process, then the median over the
processes.

Contenders (examples/td3/agents.py, random batches of Pendulum's shapes,
batch 256, as `benchmarks.runners` feeds them): the Keras port compiled
by XLA; the default `tb.TorchModule`s compiled by XLA (`make demo`'s
`--jit-compile`: each module's exact TF translation); the same with the
stale-state check left out (`_guard.add_guard` made a no-op while it is
traced: what the check costs); the same with each `Linear` written
`x @ W.T` (`matmul(transpose_b=True)`, the translation's form without XLA)
instead of the `(W @ x.T).T` it writes under XLA (what that form gains in
the whole step); pure torch as written; pure torch with the
actor's loss differentiated for the actor's parameters only. Writes
paired_step.json and paired_step.md.
"""

import argparse
import json
import os
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow  # noqa: E402  (imported here: after torch)

from benchmarks import harness  # noqa: E402
from benchmarks import runners  # noqa: E402

KERAS_XLA = "Keras port, XLA"
TB_XLA = "torchbridge, XLA"
TB_XLA_UNCHECKED = "torchbridge, XLA, stale-state check left out"
TB_XLA_TRANSPOSE_B = "torchbridge, XLA, linear written x @ W.T (its form without XLA)"
TORCH = "pure torch"
TORCH_ACTOR_ONLY = "pure torch, actor loss for the actor only"
CONTENDERS = (KERAS_XLA, TB_XLA, TB_XLA_UNCHECKED, TB_XLA_TRANSPOSE_B, TORCH, TORCH_ACTOR_ONLY)
BLOCK = 100


def _variant(name):
  """(object, attribute, replacement) patched while `name`'s step is traced:
  the default runner's step with one piece of the translation changed."""
  # pylint: disable=import-outside-toplevel
  from torchbridge._capture import _guard
  from torchbridge._translate._aten import _nn

  if name == TB_XLA_UNCHECKED:  # no stale-state check
    return _guard, "add_guard", lambda *args, **kwargs: None
  if name == TB_XLA_TRANSPOSE_B:  # the form the translation writes without XLA
    return _nn, "_times_transposed", lambda x, w: tensorflow.matmul(x, w, transpose_b=True)
  return None


def _build(name):
  variant = _variant(name)
  if variant is not None:
    with mock.patch.object(*variant):
      step = runners._td3_step(runners.XLA)  # pylint: disable=protected-access
      step()  # traced (and captured) with the variant
    return step
  source = {KERAS_XLA: runners.KERAS_XLA, TB_XLA: runners.XLA}.get(name, name)
  return runners._td3_step(source)  # pylint: disable=protected-access


def _fetch(result):
  # The losses fetched, as the script does after each step.
  for value in result if isinstance(result, tuple) else (result,):
    float(value)


def one(order, rounds, threads):
  """One process: the contenders built in `order`, timed in turns."""
  harness.configure_threads(threads)
  names = [CONTENDERS[int(k)] for k in order.split(",")]
  steps = {name: _build(name) for name in names}
  # Warmed (tracing, capture, XLA's compile), then in turns, the order rotating.
  timings = harness.interleaved(
    {name: lambda step=steps[name]: _fetch(step()) for name in names},
    repeats=rounds,
    calls=BLOCK,
    warmup=20,
  )
  blocks = {name: timings[name]["samples_us"] for name in names}
  return {"order": names, "blocks_us": blocks, "torch": torch.__version__}


def summarize(records):
  """Per contender: the median block (us) of each process, and the median
  over the processes of the per-process median of its per-round ratios to
  the Keras port and to each pure-torch baseline."""
  result = {}
  for name in CONTENDERS:
    per_process, ratios = [], {KERAS_XLA: [], TORCH: [], TORCH_ACTOR_ONLY: []}
    for record in records:
      mine = np.array(record["blocks_us"][name])
      per_process.append(float(np.median(mine)))
      for base in ratios:
        ratios[base].append(float(np.median(mine / np.array(record["blocks_us"][base]))))
    result[name] = {
      "median_us_per_process": per_process,
      "median_us": float(np.median(per_process)),
      "ratio_to": {base: float(np.median(r)) for base, r in ratios.items()},
      "ratio_to_per_process": ratios,
    }
  return result


def markdown(data):
  source, result = data["source"], data["result"]
  changed = (
    f", with changes to {', '.join(source['changed_since'])}" if source["changed_since"] else ""
  )
  lines = [
    f"Measured at {source['commit'][:10]}{changed} (torch {data['torch']}): the TD3 train "
    f"step, batch 256, every contender in each of {data['processes']} processes, taking "
    f"turns in blocks of {BLOCK} steps, {data['rounds']} rounds, the order rotating; "
    f"{data['threads']} threads. Ratios: per round against the same round's block, the "
    "median per process, then over the processes (each process's figure after the slash).",
    "",
    "| td3 train step | ms | / Keras port, XLA | / pure torch | "
    "/ pure torch, actor loss for the actor only |",
    "|---|---|---|---|---|",
  ]
  for name in CONTENDERS:
    row = result[name]
    cells = [
      f"{row['ratio_to'][base]:.2f}x ("
      + " / ".join(f"{v:.2f}" for v in row["ratio_to_per_process"][base])
      + ")"
      for base in (KERAS_XLA, TORCH, TORCH_ACTOR_ONLY)
    ]
    lines.append(f"| {name} | {row['median_us'] / 1e3:.2f} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.paired_step", description=__doc__)
  parser.add_argument("--one", metavar="ORDER")
  parser.add_argument("--processes", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  if args.one:
    print(json.dumps(one(args.one, args.rounds, args.threads)))
    return 0
  records = []
  for p in range(args.processes):
    shift = p % len(CONTENDERS)
    order = list(range(len(CONTENDERS)))
    order = order[shift:] + order[:shift]
    records.append(
      harness.run_process(
        "benchmarks.paired_step",
        ["--one", ",".join(map(str, order)), "--rounds", args.rounds, "--threads", args.threads],
        timeout=1800,
      )
    )
  data = {
    "source": harness.environment(args.threads, "cpu")["source"],
    "processes": args.processes,
    "rounds": args.rounds,
    "threads": args.threads,
    "torch": records[0]["torch"],
    "result": summarize(records),
    "records": records,
  }
  harness.write_results(args.out, "paired_step", data, markdown(data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
